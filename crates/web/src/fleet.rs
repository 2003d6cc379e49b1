//! The per-core layout seen whole, from its parent: what `web serve --metrics-listen` shows
//! with `--model prefork` or `--adaptive-layout per-core`.
//!
//! Each child answers `/metrics`, `/health` and `/ready` on the shared port (whichever child
//! takes the connection answers for itself) and on a loopback port of its own, which it names
//! in its ready line ([`crate::prefork::READY_LINE`]). The parent's [`Fleet`] fetches every
//! child's page from those ports at each scrape, in parallel, and joins them with its own
//! `process_*` metrics into one page ([`ops::merge`]): each child's samples carry
//! `worker="N"`, the parent's none, and `web_worker_up{worker="N"}` says whether child N's
//! page is in this scrape. Its `/ready` is 200 only while every child answers its own `/ready`
//! with 200 (a child that is gone, or draining after SIGTERM, makes the whole server not
//! ready). Everything runs on the admin listener's thread, never on a child.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ops::merge::{Page, merge};

/// The longest the parent waits for one child's answer: a child on loopback answers in
/// microseconds unless it is stuck, and a scrape must end well within Prometheus' 10 s.
pub const CHILD_ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// The parent's view of its children's admin ports (see the module docs).
pub struct Fleet {
    /// Each child's private admin address, by worker index.
    children: Vec<SocketAddr>,
    /// The token the children's `/metrics` require, if any.
    metrics_token: Option<String>,
    /// The parent's own metrics: `process_*` and `web_worker_up`.
    registry: ops::Registry,
    /// Whether each child's page was fetched in the scrape being rendered.
    up: Arc<[AtomicBool]>,
}

impl Fleet {
    /// The view over `children` (each child's admin address, by worker index), whose
    /// `/metrics` take `metrics_token`.
    pub fn new(children: Vec<SocketAddr>, metrics_token: Option<String>) -> Fleet {
        let up: Arc<[AtomicBool]> = children.iter().map(|_| AtomicBool::new(false)).collect();
        let mut registry = ops::Registry::default();
        registry.register_collector(Box::new(ops::process::ProcessCollector));
        for worker in 0..children.len() {
            let label = (Cow::Borrowed("worker"), Cow::Owned(worker.to_string()));
            let up = Arc::clone(&up);
            // Relaxed: set and read on the admin thread within one scrape; atomic only
            // because the registry's readers must be shareable.
            let read = ops::read::gauge(move || i64::from(up[worker].load(Ordering::Relaxed)));
            let help = "1 when this worker's page is in the scrape, 0 when it did not answer";
            registry.sub_registry_with_label(label).register("web_worker_up", help, read);
        }
        Fleet { children, metrics_token, registry, up }
    }

    /// Every child's answer to `GET path`, fetched in parallel; `None` where it failed.
    fn ask_all(&self, path: &str) -> Vec<Option<(u16, String)>> {
        let token = self.metrics_token.as_deref();
        std::thread::scope(|scope| {
            let asks: Vec<_> = self
                .children
                .iter()
                .enumerate()
                .map(|(worker, &addr)| {
                    scope.spawn(move || {
                        let answer = ops::endpoint::fetch(addr, path, token, CHILD_ANSWER_TIMEOUT);
                        if let Err(error) = &answer {
                            tracing::warn!(worker, %error, path, "no answer from the worker");
                        }
                        answer.ok()
                    })
                })
                .collect();
            asks.into_iter().map(|ask| ask.join().ok().flatten()).collect()
        })
    }
}

impl ops::endpoint::Source for Fleet {
    fn page(&self) -> String {
        let answers = self.ask_all("/metrics");
        for (answer, up) in answers.iter().zip(self.up.iter()) {
            up.store(matches!(answer, Some((200, _))), Ordering::Relaxed);
        }
        // After the fetches: `web_worker_up` reads what they found.
        let own = ops::endpoint::render(&self.registry);
        let workers: Vec<String> = (0..answers.len()).map(|worker| worker.to_string()).collect();
        let children = answers.iter().zip(&workers).filter_map(|(answer, worker)| match answer {
            Some((200, text)) => Some(Page { label_value: Some(worker.as_str()), text }),
            _ => None,
        });
        let pages: Vec<Page> =
            std::iter::once(Page { label_value: None, text: &own }).chain(children).collect();
        merge("worker", &pages)
    }

    fn is_ready(&self) -> bool {
        self.ask_all("/ready").iter().all(|answer| matches!(answer, Some((200, _))))
    }
}
