//! Progress bars of long runs on stderr (`indicatif`), hidden when stderr is not a terminal so
//! logs and CI output stay clean. Here, not in `lab`, so that no server compiles them.

use std::borrow::Cow;
use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar of `length` steps on stderr; hidden when stderr is not a terminal.
pub fn progress_bar(length: u64, message: impl Into<Cow<'static, str>>) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(
        "{msg:24} [{bar:40.cyan/blue}] {pos}/{len} {elapsed_precise} (eta {eta})",
    )
    .expect("constant template is valid")
    .progress_chars("=> ");
    ProgressBar::new(length).with_style(style).with_message(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_bar_is_hidden_exactly_when_stderr_is_not_a_terminal() {
        let bar = progress_bar(10, "test");
        assert_eq!(bar.is_hidden(), !std::io::stderr().is_terminal());
        bar.inc(3);
        assert_eq!(bar.position(), 3);
    }
}
