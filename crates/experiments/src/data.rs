//! Data files people can load: [`DataTable`] (one header row whose column names carry the
//! units, `rate_msgs_per_s`, `p99_us`, `within_30us_pct`; numbers as numbers, text only where
//! the value is a name) written as CSV and JSON, and HdrHistogram's `.hgrm` percentile
//! distribution ([`hgrm`]), the text that HdrHistogram's plotter and wrk2's tools read.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{Map, Value as Json};

use stats::LatencyHistogram;

/// One cell: a number, a name, or nothing (the paper or the run has no value there).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Cell {
    Number(f64),
    Text(String),
    Missing,
}

impl From<f64> for Cell {
    fn from(value: f64) -> Self {
        if value.is_finite() { Cell::Number(value) } else { Cell::Missing }
    }
}

impl From<u64> for Cell {
    fn from(value: u64) -> Self {
        Cell::Number(value as f64)
    }
}

impl From<usize> for Cell {
    fn from(value: usize) -> Self {
        Cell::Number(value as f64)
    }
}

impl From<&str> for Cell {
    fn from(value: &str) -> Self {
        Cell::Text(value.into())
    }
}

impl From<String> for Cell {
    fn from(value: String) -> Self {
        Cell::Text(value)
    }
}

impl<T: Into<Cell>> From<Option<T>> for Cell {
    fn from(value: Option<T>) -> Self {
        value.map_or(Cell::Missing, Into::into)
    }
}

impl Cell {
    /// The cell as a number, if it is one.
    pub fn number(&self) -> Option<f64> {
        match self {
            Cell::Number(value) => Some(*value),
            _ => None,
        }
    }

    /// The cell as people read it: numbers with up to 4 decimals, no trailing zeros.
    pub fn display(&self) -> String {
        match self {
            Cell::Number(value) if value.fract() == 0.0 && value.abs() < 1e15 => {
                format!("{value:.0}")
            }
            Cell::Number(value) => {
                let text = format!("{value:.4}");
                text.trim_end_matches('0').trim_end_matches('.').to_string()
            }
            Cell::Text(text) => text.clone(),
            Cell::Missing => String::new(),
        }
    }
}

/// A table of typed cells with a file name (`name.csv`, `name.json`) saying what it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct DataTable {
    pub name: String,
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

impl DataTable {
    /// An empty table; `name` is the file stem, `columns` carry their units.
    pub fn new<S: Into<String>>(
        name: &str,
        title: &str,
        columns: impl IntoIterator<Item = S>,
    ) -> Self {
        let columns = columns.into_iter().map(Into::into).collect();
        Self { name: name.into(), title: title.into(), columns, rows: Vec::new() }
    }

    /// Appends a row; missing trailing cells are [`Cell::Missing`].
    ///
    /// # Panics
    /// If the row has more cells than the table has columns (a programming error).
    pub fn push(&mut self, cells: Vec<Cell>) -> &mut Self {
        assert!(cells.len() <= self.columns.len(), "row wider than the table {}", self.name);
        let mut cells = cells;
        cells.resize(self.columns.len(), Cell::Missing);
        self.rows.push(cells);
        self
    }

    /// The column's index by name.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }

    /// CSV (RFC 4180 quoting): the header, then one line per row; numbers unquoted.
    pub fn to_csv(&self) -> String {
        let quote = |text: &str| {
            if text.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", text.replace('"', "\"\""))
            } else {
                text.to_string()
            }
        };
        let mut csv = self.columns.iter().map(|c| quote(c)).collect::<Vec<_>>().join(",") + "\n";
        for row in &self.rows {
            let cells: Vec<String> = row
                .iter()
                .map(|cell| match cell {
                    Cell::Number(value) => value.to_string(),
                    Cell::Text(text) => quote(text),
                    Cell::Missing => String::new(),
                })
                .collect();
            csv += &(cells.join(",") + "\n");
        }
        csv
    }

    /// JSON: an array of objects keyed by column name (missing cells are `null`).
    pub fn to_json(&self) -> Json {
        let rows = self.rows.iter().map(|row| {
            let object: Map<String, Json> = self
                .columns
                .iter()
                .zip(row)
                .map(|(column, cell)| {
                    (column.clone(), serde_json::to_value(cell).unwrap_or(Json::Null))
                })
                .collect();
            Json::Object(object)
        });
        Json::Array(rows.collect())
    }
}

/// The percentile distribution of `histogram` in HdrHistogram's `.hgrm` text format, values
/// in µs: five steps per halving of the distance to 100%, then the mean, maximum and count.
pub fn hgrm(histogram: &LatencyHistogram) -> String {
    let mut text = format!(
        "{:>12} {:>14} {:>10} {:>14}\n\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    );
    let hdr = histogram.as_hdr();
    let mut total = 0_u64;
    for step in hdr.iter_quantiles(5) {
        total += step.count_since_last_iteration();
        let quantile = step.quantile_iterated_to();
        let value_us = step.value_iterated_to() as f64 / 1_000.0;
        let _ = write!(text, "{value_us:12.3} {quantile:14.12} {total:10}");
        if quantile < 1.0 {
            let _ = write!(text, " {:14.2}", 1.0 / (1.0 - quantile));
        }
        text.push('\n');
    }
    let _ = writeln!(
        text,
        "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]",
        histogram.mean_ns() / 1_000.0,
        histogram.stdev_ns() / 1_000.0
    );
    let _ = writeln!(
        text,
        "#[Max     = {:12.3}, Total count    = {:12}]",
        histogram.max_ns() as f64 / 1_000.0,
        histogram.count()
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_keeps_numbers_as_numbers_and_quotes_text() {
        let mut table = DataTable::new("rates", "Rates", ["config", "rate_msgs_per_s", "p99_us"]);
        table.push(vec!["a, b".into(), 20_000.0.into(), 12.5.into()]);
        table.push(vec!["c".into(), Cell::Missing]);
        assert_eq!(table.to_csv(), "config,rate_msgs_per_s,p99_us\n\"a, b\",20000,12.5\nc,,\n");
        let json = table.to_json();
        assert_eq!(json[0]["rate_msgs_per_s"], 20_000.0);
        assert_eq!(json[1]["p99_us"], Json::Null);
        assert_eq!(table.column("p99_us"), Some(2));
    }

    #[test]
    fn cells_display_without_noise() {
        assert_eq!(Cell::from(20_000.0).display(), "20000");
        assert_eq!(Cell::from(0.123456).display(), "0.1235");
        assert_eq!(Cell::from(f64::NAN), Cell::Missing);
        assert_eq!(Cell::from(None::<f64>).display(), "");
    }

    #[test]
    fn hgrm_lists_percentiles_up_to_the_maximum() {
        let samples: Vec<u64> = (1..=1_000).map(|i| i * 1_000).collect();
        let latency = LatencyHistogram::from_samples_ns(&samples);
        let text = hgrm(&latency);
        let first = text.lines().next().unwrap();
        assert!(first.contains("Percentile") && first.contains("TotalCount"), "{first}");
        let rows: Vec<&str> =
            text.lines().skip(2).take_while(|line| !line.starts_with('#')).collect();
        let last: Vec<&str> = rows.last().unwrap().split_whitespace().collect();
        assert_eq!(last[1].parse::<f64>().unwrap(), 1.0);
        assert_eq!(last[2], "1000");
        assert!(text.contains("#[Max     ="), "{text}");
    }
}
