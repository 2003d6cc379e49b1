//! Prometheus text pages (format 0.0.4, as [`crate::endpoint::render`] writes them) of several
//! processes joined into one page, as a supervisor shows the
//! processes it runs on one listener: each page's samples gain a label naming their process
//! (none for the supervisor's own), and each metric family is written once, its `# HELP` and
//! `# TYPE` from the first page that has it, followed by its samples from every page (the text
//! format wants a family's lines together, under one `# TYPE`). Sums over the processes are
//! then one query away: `sum without (worker) (rate(web_requests_total[1m]))`.

use std::collections::HashMap;

/// One process's page and the label value its samples gain (`None`: kept as they are).
#[derive(Clone, Copy, Debug)]
pub struct Page<'a> {
    pub label_value: Option<&'a str>,
    pub text: &'a str,
}

/// One metric family: its comment lines and its samples, in the order they came.
#[derive(Default)]
struct Family {
    comments: Vec<String>,
    samples: Vec<String>,
}

/// `pages` as one page whose samples carry `label_name` (see the module docs).
pub fn merge(label_name: &str, pages: &[Page<'_>]) -> String {
    // Families in the order they first appear; samples before any family's comments go to
    // the nameless one, first.
    let mut families: Vec<Family> = vec![Family::default()];
    let mut by_name: HashMap<&str, usize> = HashMap::from([("", 0)]);
    for page in pages {
        let mut current = 0;
        for line in page.text.lines().filter(|line| !line.is_empty()) {
            let Some(comment) = line.strip_prefix("# ") else {
                let sample = match page.label_value {
                    Some(value) => labelled(line, label_name, value),
                    None => line.to_string(),
                };
                families[current].samples.push(sample);
                continue;
            };
            // `# HELP name …`, `# TYPE name …`.
            let name = comment.split_ascii_whitespace().nth(1).unwrap_or_default();
            current = *by_name.entry(name).or_insert_with(|| {
                families.push(Family::default());
                families.len() - 1
            });
            let comments = &mut families[current].comments;
            // The first page's only: a second `# TYPE` for a family is an error to a parser.
            if !comments.iter().any(|kept| same_kind(kept, line)) {
                comments.push(line.to_string());
            }
        }
    }
    let mut merged = String::new();
    for family in &families {
        for line in family.comments.iter().chain(&family.samples) {
            merged.push_str(line);
            merged.push('\n');
        }
    }
    merged
}

/// Whether two comment lines are of one kind (`# HELP`, `# TYPE`).
fn same_kind(a: &str, b: &str) -> bool {
    a.split_ascii_whitespace().nth(1) == b.split_ascii_whitespace().nth(1)
}

/// `sample` (`name{labels} value…` or `name value…`) with `name="value"` first among its
/// labels.
fn labelled(sample: &str, name: &str, value: &str) -> String {
    let label = format!("{name}=\"{value}\"");
    match sample.find(['{', ' ']) {
        Some(at) if sample[at..].starts_with("{}") => {
            format!("{}{{{label}}}{}", &sample[..at], &sample[at + 2..])
        }
        Some(at) if sample[at..].starts_with('{') => {
            format!("{}{{{label},{}", &sample[..at], &sample[at + 1..])
        }
        Some(at) => format!("{}{{{label}}}{}", &sample[..at], &sample[at..]),
        None => sample.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_gain_their_process_label_and_each_family_is_written_once() {
        let own = "# HELP up_seconds uptime.\n# TYPE up_seconds gauge\nup_seconds 5\n";
        let child = "# HELP req_total requests.\n# TYPE req_total counter\nreq_total 3\n\
                     # HELP lat latency.\n# TYPE lat histogram\nlat_sum 0.5\nlat_count 2\n\
                     lat_bucket{le=\"0.1\"} 1\nlat_bucket{le=\"+Inf\"} 2\n\
                     # HELP up_seconds uptime.\n# TYPE up_seconds gauge\nup_seconds 4\n";
        let other_child = child.replace("req_total 3", "req_total 4");
        let pages = [
            Page { label_value: None, text: own },
            Page { label_value: Some("0"), text: child },
            Page { label_value: Some("1"), text: &other_child },
        ];
        let merged = merge("worker", &pages);
        for line in [
            "up_seconds 5",
            "up_seconds{worker=\"1\"} 4",
            "req_total{worker=\"0\"} 3",
            "req_total{worker=\"1\"} 4",
            "lat_bucket{worker=\"0\",le=\"+Inf\"} 2",
        ] {
            assert!(merged.lines().any(|l| l == line), "{line:?} missing from\n{merged}");
        }
        assert_eq!(merged.matches("# TYPE up_seconds").count(), 1, "{merged}");
        let lines = merged.lines().map(|line| Ok(line.to_string()));
        let scrape = prometheus_parse::Scrape::parse(lines).expect("a Prometheus text page");
        let requests: f64 = scrape
            .samples
            .iter()
            .filter(|s| s.metric == "req_total")
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) => v,
                ref other => panic!("{other:?}"),
            })
            .sum();
        assert_eq!(requests, 7.0);
        let histograms = scrape.samples.iter().filter(|s| s.metric == "lat");
        let mut workers: Vec<_> = histograms.filter_map(|s| s.labels.get("worker")).collect();
        workers.sort_unstable();
        assert_eq!(workers, ["0", "1"], "one histogram per worker");
    }

    #[test]
    fn a_label_goes_first_whatever_the_sample_holds() {
        assert_eq!(labelled("a 1", "w", "2"), "a{w=\"2\"} 1");
        assert_eq!(labelled("a{} 1", "w", "2"), "a{w=\"2\"} 1");
        assert_eq!(
            labelled("a{le=\"1\"} 1 # {x=\"y\"} 1", "w", "2"),
            "a{w=\"2\",le=\"1\"} 1 # {x=\"y\"} 1"
        );
    }
}
