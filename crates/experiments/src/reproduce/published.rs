//! The published figures of the five papers (`crates/experiments/data/published.toml`, a copy of the project's
//! transcription, embedded in the binary; `--published FILE` reads another copy).

use std::path::Path;

use crate::data::{Cell, DataTable};
use anyhow::Context;
use toml::{Table as TomlTable, Value};

/// The transcription as shipped with this binary.
const EMBEDDED: &str = include_str!("../../data/published.toml");

/// Every paper's published tables.
pub struct Published {
    root: TomlTable,
}

/// One paper: its header and its sub-tables in file order.
pub struct PublishedPaper<'a> {
    pub id: &'static str,
    pub title: String,
    pub authors: String,
    pub setup: String,
    table: &'a TomlTable,
}

impl Published {
    /// The embedded copy, or `path`'s.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Published> {
        let text = match path {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
            None => EMBEDDED.to_string(),
        };
        let root: TomlTable = text.parse().context("published figures are not valid TOML")?;
        Ok(Published { root })
    }

    /// Paper `id` (`"000"` … `"004"`).
    pub fn paper(&self, id: &'static str) -> anyhow::Result<PublishedPaper<'_>> {
        let table = self
            .root
            .get(&format!("seed_{id}"))
            .and_then(Value::as_table)
            .with_context(|| format!("the published figures have no paper {id}"))?;
        let text = |key: &str| table.get(key).and_then(Value::as_str).unwrap_or("").to_string();
        Ok(PublishedPaper {
            id,
            title: text("title"),
            authors: text("authors"),
            setup: text("setup"),
            table,
        })
    }
}

impl PublishedPaper<'_> {
    /// The sub-table `key` (e.g. `fig5b_load_variation`).
    fn sub_table(&self, key: &str) -> Option<&TomlTable> {
        self.table.get(key).and_then(Value::as_table)
    }

    /// The rows of sub-table `key`.
    fn rows(&self, key: &str) -> Vec<&TomlTable> {
        let rows = self.sub_table(key).and_then(|t| t.get("rows")).and_then(Value::as_array);
        rows.map(|rows| rows.iter().filter_map(Value::as_table).collect()).unwrap_or_default()
    }

    /// The number in column `column` of the first row of `key` whose `match_column` is
    /// `match_value` (compared as printed text).
    pub fn number(
        &self,
        key: &str,
        match_column: &str,
        match_value: &str,
        column: &str,
    ) -> Option<f64> {
        self.row_number(key, &[(match_column, match_value)], column)
    }

    /// The number in column `column` of the first row of `key` that matches every
    /// (column, printed value) pair.
    pub fn row_number(&self, key: &str, matches: &[(&str, &str)], column: &str) -> Option<f64> {
        let row = self.rows(key).into_iter().find(|row| {
            matches.iter().all(|(c, v)| row.get(*c).is_some_and(|value| value_text(value) == *v))
        })?;
        row.get(column).and_then(value_number)
    }

    /// The printed text of column `column` in the first row of `key` whose `match_column` is
    /// `match_value` (arrays joined with `-`, as in `1-1-1-5`).
    pub fn text(
        &self,
        key: &str,
        match_column: &str,
        match_value: &str,
        column: &str,
    ) -> Option<String> {
        let row = self
            .rows(key)
            .into_iter()
            .find(|row| row.get(match_column).is_some_and(|v| value_text(v) == match_value))?;
        row.get(column).map(value_text)
    }

    /// Every sub-table as a [`DataTable`] (caption as title; setup and note beside it).
    pub fn tables(&self) -> Vec<(DataTable, String)> {
        self.table
            .iter()
            .filter_map(|(key, value)| Some((key, value.as_table()?)))
            .map(|(key, sub)| {
                let columns: Vec<String> = sub
                    .get("columns")
                    .and_then(Value::as_array)
                    .map(|c| c.iter().map(value_text).collect())
                    .unwrap_or_default();
                let caption = sub.get("caption").map(value_text).unwrap_or_default();
                let mut table = DataTable::new(key, &caption, columns.clone());
                for row in self.rows(key) {
                    table.push(
                        columns.iter().map(|c| row.get(c).map_or(Cell::Missing, cell)).collect(),
                    );
                }
                let notes = ["kind", "unit", "setup", "note"]
                    .iter()
                    .filter_map(|k| Some(format!("{k}: {}", value_text(sub.get(*k)?))))
                    .collect::<Vec<_>>()
                    .join(" · ");
                (table, notes)
            })
            .collect()
    }
}

fn value_number(value: &Value) -> Option<f64> {
    match value {
        Value::Integer(n) => Some(*n as f64),
        Value::Float(x) => Some(*x),
        _ => None,
    }
}

fn value_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Array(items) => items.iter().map(value_text).collect::<Vec<_>>().join("-"),
        other => other.to_string(),
    }
}

fn cell(value: &Value) -> Cell {
    value_number(value).map_or_else(|| Cell::Text(value_text(value)), Cell::Number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_figures_hold_five_papers_with_tables() {
        let published = Published::load(None).unwrap();
        for id in ["000", "001", "002", "003", "004"] {
            let paper = published.paper(id).unwrap();
            assert!(!paper.title.is_empty(), "{id}");
            assert!(!paper.tables().is_empty(), "{id}");
        }
        let lean = published.paper("000").unwrap();
        assert_eq!(lean.number("fig5b_load_variation", "load", "@20K", "p99"), Some(180.0));
        assert!(published.paper("005").is_err());
    }
}
