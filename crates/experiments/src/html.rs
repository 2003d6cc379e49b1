//! A self-contained HTML page: inline CSS, plots inlined as SVG, no script, no network, so the
//! page reads the same offline, from a CI artefact or a mail attachment.

use crate::data::{Cell, DataTable};

const STYLE: &str = "body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;\
color:#222;line-height:1.4}table{border-collapse:collapse;margin:.5em 0 1em}\
th,td{border:1px solid #ccc;padding:3px 8px}td.n{text-align:right;font-variant-numeric:tabular-nums}\
th{background:#f3f3f3}caption{text-align:left;font-weight:bold;padding:.3em 0}\
.pair{display:flex;flex-direction:column;gap:1em}.pair>div{max-width:100%}\
table{max-width:100%;font-size:14px}th,td{overflow-wrap:anywhere}\
svg{max-width:100%;height:auto}.reproduced{color:#0a6b2d;font-weight:bold}\
.not-reproduced{color:#b00020;font-weight:bold}.not-measurable{color:#8a6d00;font-weight:bold}\
.inconclusive{color:#5a3d8a;font-weight:bold}.context{color:#555;font-style:italic}\
section.paper{border-top:3px solid #0072B2;margin-top:2.5em}small,.note{color:#555}";

/// Escapes text for HTML element content and attribute values.
pub fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// An HTML document built block by block.
#[derive(Clone, Debug, Default)]
pub struct HtmlPage {
    title: String,
    body: String,
}

impl HtmlPage {
    pub fn new(title: &str) -> Self {
        Self { title: title.into(), body: String::new() }
    }

    /// `<hN>` with an optional id to link to.
    pub fn heading(&mut self, level: u8, id: Option<&str>, text: &str) -> &mut Self {
        let level = level.clamp(1, 6);
        let id = id.map_or(String::new(), |id| format!(" id=\"{}\"", escape_html(id)));
        self.body += &format!("<h{level}{id}>{}</h{level}>\n", escape_html(text));
        self
    }

    /// A paragraph of text (escaped); `class` styles it.
    pub fn paragraph(&mut self, class: Option<&str>, text: &str) -> &mut Self {
        let class = class.map_or(String::new(), |c| format!(" class=\"{}\"", escape_html(c)));
        self.body += &format!("<p{class}>{}</p>\n", escape_html(text));
        self
    }

    /// Markup the caller built (an inline SVG, a list with classes); the caller escapes text.
    pub fn raw(&mut self, html: &str) -> &mut Self {
        self.body += html;
        self.body.push('\n');
        self
    }

    /// The whole document.
    pub fn render(&self) -> String {
        format!(
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{}</body>\n</html>\n",
            escape_html(&self.title),
            self.body
        )
    }
}

/// `table` as an HTML table with its title as caption; numbers right-aligned.
pub fn table_html(table: &DataTable) -> String {
    let mut html = format!("<table>\n<caption>{}</caption>\n<tr>", escape_html(&table.title));
    for column in &table.columns {
        // `throughput_req_per_s_median` may break after each underscore, so a wide table
        // wraps its headers instead of scrolling sideways.
        html += &format!("<th>{}</th>", escape_html(column).replace('_', "_<wbr>"));
    }
    html += "</tr>\n";
    for row in &table.rows {
        html += "<tr>";
        for cell in row {
            let class = if matches!(cell, Cell::Number(_)) { " class=\"n\"" } else { "" };
            html += &format!("<td{class}>{}</td>", escape_html(&cell.display()));
        }
        html += "</tr>\n";
    }
    html + "</table>\n"
}

/// An SVG document as inline markup (its XML prolog, if any, dropped).
pub fn inline_svg(svg: &str) -> String {
    let start = svg.find("<svg").unwrap_or(0);
    svg[start..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_escapes_text_and_renders_tables() {
        let mut table = DataTable::new("t", "Rates <per s>", ["config", "rate_msgs_per_s"]);
        table.push(vec!["a&b".into(), 20_000.0.into()]);
        let mut page = HtmlPage::new("Report");
        page.heading(2, Some("paper-000"), "Lean <tier>").paragraph(None, "x < y");
        page.raw(&table_html(&table)).raw(&inline_svg("<?xml version=\"1.0\"?>\n<svg></svg>"));
        let html = page.render();
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<h2 id=\"paper-000\">Lean &lt;tier&gt;</h2>"));
        assert!(html.contains("<td>a&amp;b</td><td class=\"n\">20000</td>"));
        assert!(html.contains("<caption>Rates &lt;per s&gt;</caption>"));
        assert!(html.contains("\n<svg></svg>") && !html.contains("<?xml"));
        assert!(!html.contains("http://") && !html.contains("https://"), "no network");
    }
}
