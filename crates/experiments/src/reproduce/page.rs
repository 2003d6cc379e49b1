//! The reproduction's `index.html`: per paper, what was published, what was measured here
//! (table and plot side by side), and a verdict per claim with the rule that decided it.

use std::time::Duration;

use crate::html::{HtmlPage, escape_html, inline_svg, table_html};

use super::machine::{HostLoad, Machine};
use super::{Outcome, PaperResult, PaperSection, Verdict};

/// The verdict's word and, where there is one, why no verdict.
pub fn verdict_words(verdict: &Verdict) -> (&'static str, String) {
    match verdict {
        Verdict::Reproduced => ("reproduced", String::new()),
        Verdict::NotReproduced => ("not reproduced", String::new()),
        Verdict::Inconclusive(why) => ("inconclusive", why.clone()),
        Verdict::NotMeasurable(why) => ("not measurable here", why.clone()),
        Verdict::Context(why) => ("context only", why.clone()),
    }
}

/// The CSS class of a verdict (and its column in the overview).
const VERDICT_CLASSES: [(&str, &str); 5] = [
    ("reproduced", "reproduced"),
    ("not-reproduced", "not reproduced"),
    ("inconclusive", "inconclusive"),
    ("not-measurable", "not measurable here"),
    ("context", "context only"),
];

fn verdict_class(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Reproduced => "reproduced",
        Verdict::NotReproduced => "not-reproduced",
        Verdict::Inconclusive(_) => "inconclusive",
        Verdict::NotMeasurable(_) => "not-measurable",
        Verdict::Context(_) => "context",
    }
}

/// The verdict in words, with why and, on a loaded host, the load: for the page's cell,
/// the terminal and verdicts.csv alike.
fn verdict_text(verdict: &Verdict, host: Option<HostLoad>) -> String {
    let (word, why) = verdict_words(verdict);
    let mut text = if why.is_empty() { word.to_string() } else { format!("{word}: {why}") };
    if let Some(host) = host.filter(HostLoad::loaded) {
        text += &format!(" (on a loaded host: {})", host.text());
    }
    text
}

/// The whole page.
pub fn render(
    sections: &[PaperSection<'_>],
    machine: &Machine,
    invocation: &str,
    elapsed: Duration,
) -> String {
    let mut page = HtmlPage::new("leantier: the five papers, reproduced");
    page.heading(1, None, "leantier: the five papers, published vs measured here");
    page.paragraph(
        None,
        &format!(
            "Command: {invocation} · finished {} · {:.0} s in all. Each verdict comes from the \
             measurements of this run by the rule printed beside it, with the scope both sides \
             share: a verdict needs at least 3 repeats of each side whose ranges fall wholly on one \
             side of the rule's boundary, otherwise it is inconclusive; a published absolute \
             figure from another machine or store is context, never judged. Numbers measured on a \
             shared or virtual machine carry its noise: the host's load is measured before the run \
             and during each paper, and a verdict reached on a loaded host says so.",
            utc_now(),
            elapsed.as_secs_f64()
        ),
    );
    page.raw(&table_html(&machine.table()));
    page.raw(&overview(sections));
    for section in sections {
        paper_section(&mut page, section, machine);
    }
    page.render()
}

/// The verdict counts per paper, linking to each section.
fn overview(sections: &[PaperSection<'_>]) -> String {
    let mut html = String::from("<table>\n<caption>Verdicts</caption>\n<tr><th>paper</th>");
    for (_, word) in VERDICT_CLASSES {
        html += &format!("<th>{word}</th>");
    }
    html += "<th>host during the paper</th><th>run time (s)</th></tr>\n";
    for section in sections {
        let count = |class: &str| match &section.outcome {
            Outcome::Ran(result) => result
                .claims
                .iter()
                .filter(|c| verdict_class(&c.verdict) == class)
                .count()
                .to_string(),
            Outcome::Failed(_) => "failed".into(),
            Outcome::Skipped => "not run".into(),
        };
        html += &format!(
            "<tr><td><a href=\"#paper-{id}\">{id} {}</a></td>",
            escape_html(section.name),
            id = section.paper.id,
        );
        for (class, _) in VERDICT_CLASSES {
            html += &format!("<td class=\"n\">{}</td>", count(class));
        }
        html += &format!(
            "<td>{}</td><td class=\"n\">{:.1}</td></tr>\n",
            section.host.map_or(String::new(), |h| escape_html(&h.verdict_text())),
            section.elapsed.as_secs_f64(),
        );
    }
    html + "</table>\n"
}

fn paper_section(page: &mut HtmlPage, section: &PaperSection<'_>, machine: &Machine) {
    let paper = &section.paper;
    page.raw(&format!("<section class=\"paper\" id=\"paper-{}\">", paper.id));
    page.heading(2, None, &format!("{} · {}", paper.id, paper.title));
    page.paragraph(Some("note"), &format!("{} · published setup: {}", paper.authors, paper.setup));
    match &section.outcome {
        Outcome::Ran(result) => {
            page.heading(3, None, "Verdict per claim");
            if let Some(host) = section.host {
                page.paragraph(
                    Some("note"),
                    &format!("The host while this paper ran: {}.", host.verdict_text()),
                );
            }
            page.raw(&claims_table(result, section.host));
            page.paragraph(None, &format!("What ran here: {}", result.scope));
            measured(page, result, machine);
        }
        Outcome::Failed(error) => {
            page.paragraph(Some("not-reproduced"), &format!("The run failed: {error}"));
        }
        Outcome::Skipped => {
            page.paragraph(
                Some("note"),
                &format!(
                    "Not run this time (--only); `leantier reproduce --only {}` runs it.",
                    paper.id
                ),
            );
        }
    }
    published(page, paper);
    page.raw("</section>");
}

fn claims_table(result: &PaperResult, host: Option<HostLoad>) -> String {
    let mut html = String::from(
        "<table class=\"claims\">\n<tr><th>published claim</th><th>scope of the comparison</th>\
         <th>rule</th><th>measured here</th><th>verdict</th></tr>\n",
    );
    for claim in &result.claims {
        html += &format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td></tr>\n",
            escape_html(&claim.claim),
            escape_html(&claim.scope),
            escape_html(&claim.rule),
            escape_html(&claim.measured),
            verdict_class(&claim.verdict),
            escape_html(&verdict_text(&claim.verdict, host)),
        );
    }
    html + "</table>\n"
}

fn measured(page: &mut HtmlPage, result: &PaperResult, machine: &Machine) {
    page.heading(3, None, "Measured here");
    for figure in &result.figures {
        page.raw(&format!(
            "<div class=\"pair\"><div>{}<p class=\"note\">{} Data: <a href=\"{name}.csv\">{name}.csv</a>, \
             <a href=\"{name}.json\">{name}.json</a>. Machine: {}.</p></div><div>{}</div></div>",
            table_html(&figure.table),
            escape_html(&figure.note),
            escape_html(&machine.line()),
            figure.plot_svg.as_deref().map_or(String::new(), inline_svg),
            name = escape_html(&figure.table.name),
        ));
    }
    if !result.files.is_empty() {
        let links: Vec<String> = result
            .files
            .iter()
            .map(|f| format!("<a href=\"{0}\">{0}</a>", escape_html(f)))
            .collect();
        page.raw(&format!(
            "<p class=\"note\">HdrHistogram percentile distributions: {}</p>",
            links.join(", ")
        ));
    }
}

fn published(page: &mut HtmlPage, paper: &super::PublishedPaper<'_>) {
    page.heading(3, None, "As published");
    for (table, notes) in paper.tables() {
        page.raw(&table_html(&table));
        page.paragraph(Some("note"), &notes);
    }
}

/// One line per paper for the terminal.
pub fn summary_lines(sections: &[PaperSection<'_>]) -> String {
    let mut lines = Vec::new();
    for section in sections {
        match &section.outcome {
            Outcome::Ran(result) => {
                for claim in &result.claims {
                    let (word, why) = verdict_words(&claim.verdict);
                    let why = if why.is_empty() { String::new() } else { format!(" ({why})") };
                    let loaded = section
                        .host
                        .filter(HostLoad::loaded)
                        .map_or(String::new(), |h| format!(" (on a loaded host: {})", h.text()));
                    lines.push(format!(
                        "{} {}: {word}{why} [{}]{loaded}",
                        section.paper.id, claim.claim, claim.measured
                    ));
                }
            }
            Outcome::Failed(error) => {
                lines.push(format!("{}: the run failed: {error}", section.paper.id))
            }
            Outcome::Skipped => {}
        }
    }
    lines.join("\n")
}

/// The current UTC time as `YYYY-MM-DD HH:MM UTC` (civil-from-days, no time-zone crate).
fn utc_now() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (seconds / 86_400) as i64;
    let (hour, minute) = (seconds % 86_400 / 3_600, seconds % 3_600 / 60);
    let era_day = days + 719_468;
    let era = era_day.div_euclid(146_097);
    let day_of_era = era_day.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02} UTC")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_now_is_a_plausible_date() {
        let now = utc_now();
        assert_eq!(now.len(), "2026-11-27 11:20 UTC".len(), "{now}");
        assert!(now.starts_with("20"), "{now}");
    }
}
