//! Quiet terminals: a log line repeated word for word is shown once per window, with a count.
//!
//! An experiment that connects to NATS for each of its 140 runs logged "NATS connected" and
//! "NATS connection closed" 280 times, and `exchange run --find-max` repeated its two placement
//! warnings for each of its 40 probes: the lines that mattered scrolled away. Here, in the one
//! place that formats text logs, an event whose level, target and fields equal one shown less
//! than [`WINDOW`] ago is counted instead of printed; the next one shown after the window says
//! how many it stood for, and [`Repeats::report`] says it for the rest when the command ends.
//! Events that differ in any field (a client id, an address) are never folded. JSON logs are
//! left whole: a log collector counts for itself.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How long after showing a line its exact repeats are only counted.
pub const WINDOW: Duration = Duration::from_secs(60);

/// The lines shown, when, and how many repeats of each were hidden since.
#[derive(Clone, Default)]
pub struct Repeats(Arc<Mutex<HashMap<String, Seen>>>);

struct Seen {
    shown_at: Instant,
    hidden: u64,
}

impl Repeats {
    /// Whether to show the line `key` at `now`, and if so how many repeats it stands for
    /// (`Some(hidden)`); `None` hides it.
    fn show(&self, key: String, now: Instant) -> Option<u64> {
        let mut seen = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match seen.get_mut(&key) {
            Some(line) if now.duration_since(line.shown_at) < WINDOW => {
                line.hidden += 1;
                None
            }
            Some(line) => {
                let hidden = std::mem::take(&mut line.hidden);
                line.shown_at = now;
                Some(hidden)
            }
            None => {
                seen.insert(key, Seen { shown_at: now, hidden: 0 });
                Some(0)
            }
        }
    }

    /// One line per logged line whose last repeats were hidden, for the end of a command.
    pub fn report(&self) -> Vec<String> {
        let seen = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut lines: Vec<String> = seen
            .iter()
            .filter(|(_, line)| line.hidden > 0)
            .map(|(key, line)| format!("(repeated {} more times, not shown: {key})", line.hidden))
            .collect();
        lines.sort();
        lines
    }

    /// The text-log formatter `inner` with repeats folded.
    pub fn fold<F>(&self, inner: F) -> Fold<F> {
        Fold { inner, repeats: self.clone() }
    }
}

/// A [`FormatEvent`] that shows each distinct line once per [`WINDOW`].
pub struct Fold<F> {
    inner: F,
    repeats: Repeats,
}

impl<S, N, F> FormatEvent<S, N> for Fold<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some(hidden) = self.repeats.show(line_key(event), Instant::now()) else {
            // Nothing written: the layer writes an empty buffer, i.e. no line.
            return Ok(());
        };
        self.inner.format_event(ctx, writer.by_ref(), event)?;
        if hidden > 0 {
            let window = WINDOW.as_secs();
            writeln!(writer, "  (the line above: {hidden} more times in the last {window} s)")?;
        }
        Ok(())
    }
}

/// Level, target and every field of an event: what makes two lines the same line.
fn line_key(event: &Event<'_>) -> String {
    struct Fields(String);
    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            let _ = match field.name() {
                "message" => write!(self.0, " {value:?}"),
                name => write!(self.0, " {name}={value:?}"),
            };
        }
    }
    let metadata = event.metadata();
    let mut fields = Fields(format!("{} {}:", metadata.level(), metadata.target()));
    event.record(&mut fields);
    fields.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_repeat_is_counted_inside_the_window_and_shown_after_it() {
        let repeats = Repeats::default();
        let start = Instant::now();
        assert_eq!(repeats.show("a".into(), start), Some(0));
        assert_eq!(repeats.show("b".into(), start), Some(0), "another line is shown");
        for _ in 0..3 {
            assert_eq!(repeats.show("a".into(), start + Duration::from_secs(1)), None);
        }
        assert_eq!(repeats.report(), ["(repeated 3 more times, not shown: a)"]);
        assert_eq!(repeats.show("a".into(), start + WINDOW), Some(3), "stands for 3");
        assert!(repeats.report().is_empty(), "nothing left unreported");
    }

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().write(bytes)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn eighty_identical_warnings_print_one_line_and_distinct_ones_all_print() {
        let (buffer, repeats) = (Buffer::default(), Repeats::default());
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .map_event_format(|format| repeats.fold(format))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            for probe in 0..80 {
                tracing::warn!("placement: oversubscribed");
                tracing::info!(probe, "probe done");
            }
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches("placement: oversubscribed").count(), 1, "{text}");
        assert_eq!(text.matches("probe done").count(), 80, "fields differ: all shown");
        let report = repeats.report();
        assert_eq!(report.len(), 1, "{report:?}");
        assert!(report[0].starts_with("(repeated 79 more times"), "{report:?}");
        assert!(report[0].contains("WARN"), "{report:?}");
    }
}
