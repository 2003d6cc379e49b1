//! A JetStream cluster of `nats-server` children on loopback ports, for tests, soaks and
//! benchmarks (a dev-dependency of the crates whose tests run one; `replication` ships
//! without it): each node with its own store folder, routes to every other node, killable
//! (SIGKILL) and restartable on its ports. `scripts/nats-env cluster` starts the same layout
//! for a shell.

use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why a cluster node could not be started, signalled or restarted; the message says which
/// and why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClusterError(pub String);

/// How long a node may take to accept client connections.
pub const NODE_START_TIMEOUT: Duration = Duration::from_secs(20);
/// The server binary (the Debian package `nats-server`).
pub const SERVER_BINARY: &str = "nats-server";

struct Node {
    name: String,
    client_port: u16,
    route_port: u16,
    /// The HTTP monitoring port: `/healthz` says when JetStream is current.
    monitor_port: u16,
    store: PathBuf,
    child: Option<Child>,
}

/// A running cluster; its nodes are killed when it is dropped.
pub struct Cluster {
    nodes: Vec<Node>,
    routes: String,
    /// Where the nodes take clients (routes and monitoring stay on loopback).
    client_host: Ipv4Addr,
    _root: tempfile::TempDir,
}

/// How many times [`Cluster::start_on`] tries.
const CLUSTER_START_TRIES: u32 = 3;

impl Cluster {
    /// Starts `nodes` servers with JetStream (1: a single server, no cluster) taking clients
    /// on loopback.
    pub fn start(nodes: usize) -> Result<Cluster, ClusterError> {
        Cluster::start_on(nodes, Ipv4Addr::LOCALHOST)
    }

    /// [`Cluster::start`] taking clients on `client_host` (`0.0.0.0`: every interface, for
    /// clients in other network namespaces).
    /// Ports are picked free, then bound by the children: a test beside it can take one in
    /// between, so a start whose node cannot bind is tried again on fresh ports (up to
    /// `CLUSTER_START_TRIES` times).
    pub fn start_on(nodes: usize, client_host: Ipv4Addr) -> Result<Cluster, ClusterError> {
        let mut tries = 1;
        loop {
            match Cluster::start_once(nodes, client_host) {
                Ok(cluster) => return Ok(cluster),
                Err(error) if tries < CLUSTER_START_TRIES => {
                    tracing::warn!("cluster start, try {tries}: {error}; again on fresh ports");
                    tries += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    fn start_once(nodes: usize, client_host: Ipv4Addr) -> Result<Cluster, ClusterError> {
        let root = tempfile::tempdir().map_err(|e| ClusterError(e.to_string()))?;
        let free = || -> Result<u16, ClusterError> {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0));
            let port = listener.and_then(|l| l.local_addr()).map(|a| a.port());
            port.map_err(|e| ClusterError(e.to_string()))
        };
        let mut planned = Vec::new();
        for index in 1..=nodes {
            let (name, store) = (format!("n{index}"), root.path().join(format!("n{index}")));
            planned.push(Node {
                name,
                client_port: free()?,
                route_port: free()?,
                monitor_port: free()?,
                store,
                child: None,
            });
        }
        let routes = planned.iter().map(|n| format!("nats://127.0.0.1:{}", n.route_port));
        let routes = routes.collect::<Vec<_>>().join(",");
        let mut cluster = Cluster { nodes: planned, routes, client_host, _root: root };
        for index in 0..nodes {
            cluster.spawn(index)?;
        }
        for index in 0..nodes {
            cluster.wait_ready(index)?;
        }
        Ok(cluster)
    }

    /// Every node's client URL on loopback, comma-separated (what a client's connect takes).
    pub fn url(&self) -> String {
        self.url_at(Ipv4Addr::LOCALHOST)
    }

    /// Every node's client URL on loopback but node `index`'s (a client that never talks to a
    /// node about to be killed).
    pub fn url_without(&self, index: usize) -> String {
        let others = self.nodes.iter().enumerate().filter(|(at, _)| *at != index);
        let urls = others.map(|(_, n)| format!("nats://127.0.0.1:{}", n.client_port));
        urls.collect::<Vec<_>>().join(",")
    }

    /// Every node's client URL at `host` (an address of this host the nodes listen on).
    pub fn url_at(&self, host: Ipv4Addr) -> String {
        let urls = self.nodes.iter().map(|n| format!("nats://{host}:{}", n.client_port));
        urls.collect::<Vec<_>>().join(",")
    }

    /// The node that leads JetStream stream `stream` now, by its index (`None`: no leader yet,
    /// a single server, or no such stream), asked over `client`.
    pub async fn stream_leader(&self, client: async_nats::Client, stream: &str) -> Option<usize> {
        let mut js = async_nats::jetstream::new(client);
        // Short: a poll while no node leads must not wait out JetStream's 5 s default.
        js.set_timeout(std::time::Duration::from_millis(250));
        let mut stream = js.get_stream(stream).await.ok()?;
        let leader = stream.info().await.ok()?.cluster.as_ref()?.leader.clone()?;
        self.node_named(&leader)
    }

    /// The nodes that hold JetStream stream `stream` (its leader and other replicas), by
    /// index, asked over `client` (empty: no leader yet, or no such stream).
    pub async fn stream_nodes(&self, client: async_nats::Client, stream: &str) -> Vec<usize> {
        let mut js = async_nats::jetstream::new(client);
        js.set_timeout(std::time::Duration::from_millis(250));
        let Ok(mut stream) = js.get_stream(stream).await else { return Vec::new() };
        let Ok(info) = stream.info().await else { return Vec::new() };
        let Some(cluster) = info.cluster.clone() else { return Vec::new() };
        let names = cluster.leader.into_iter().chain(cluster.replicas.into_iter().map(|r| r.name));
        names.filter_map(|name| self.node_named(&name)).collect()
    }

    /// The nodes that lead JetStream stream `stream`'s consumers (an ordered consumer is one
    /// replica, on one node), by index, asked over `client`.
    pub async fn consumer_nodes(&self, client: async_nats::Client, stream: &str) -> Vec<usize> {
        use futures_util::StreamExt;
        let mut js = async_nats::jetstream::new(client);
        js.set_timeout(std::time::Duration::from_millis(250));
        let Ok(stream) = js.get_stream(stream).await else { return Vec::new() };
        let infos: Vec<_> = stream.consumers().collect().await;
        let leaders = infos.into_iter().filter_map(|info| info.ok()?.cluster?.leader);
        leaders.filter_map(|name| self.node_named(&name)).collect()
    }

    /// The index of the node named `name` (a server's `server_name`).
    pub fn node_named(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|node| node.name == name)
    }

    /// Whether node `index` runs (not killed, or restarted).
    pub fn is_up(&self, index: usize) -> bool {
        self.nodes[index].child.is_some()
    }

    /// Kills node `index` with SIGKILL (its store stays for a restart).
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.nodes[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Pauses node `index` (SIGSTOP): its sockets stay open and its kernel still takes what
    /// clients send, but it reads and answers nothing until [`Cluster::resume`].
    pub fn pause(&self, index: usize) -> Result<(), ClusterError> {
        self.signal(index, "-STOP")
    }

    /// Resumes a paused node (SIGCONT).
    pub fn resume(&self, index: usize) -> Result<(), ClusterError> {
        self.signal(index, "-CONT")
    }

    fn signal(&self, index: usize, signal: &str) -> Result<(), ClusterError> {
        let node = &self.nodes[index];
        let Some(child) = &node.child else {
            return Err(ClusterError(format!("node {} is not running", node.name)));
        };
        let sent = Command::new("kill").args([signal, &child.id().to_string()]).status();
        match sent {
            Ok(status) if status.success() => Ok(()),
            other => Err(ClusterError(format!("kill {signal} {}: {other:?}", node.name))),
        }
    }

    /// Node `index`'s client URL on loopback alone (a client that talks to that node until it
    /// loses its connection, then to the nodes the cluster told it of).
    pub fn url_of(&self, index: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[index].client_port)
    }

    /// Restarts a killed node on its ports and store and waits until it accepts clients.
    pub fn restart(&mut self, index: usize) -> Result<(), ClusterError> {
        self.spawn(index)?;
        self.wait_ready(index)
    }

    fn spawn(&mut self, index: usize) -> Result<(), ClusterError> {
        let clustered = self.nodes.len() > 1;
        let node = &mut self.nodes[index];
        let mut command = Command::new(SERVER_BINARY);
        let (host, port) = (self.client_host.to_string(), node.client_port.to_string());
        command.args(["-a", &host, "-p", &port, "-n", &node.name]);
        command.args(["-m", &node.monitor_port.to_string()]);
        command.arg("-js").arg("-sd").arg(&node.store);
        if clustered {
            let listen = format!("nats://127.0.0.1:{}", node.route_port);
            command.args(["--cluster_name", "leantier", "--cluster", &listen]);
            command.args(["--routes", &self.routes]);
        }
        let child = command.stdout(Stdio::null()).stderr(Stdio::null()).spawn();
        let child = child.map_err(|error| {
            ClusterError(format!(
                "cannot run {SERVER_BINARY} ({error}): install the Debian package nats-server \
                 (scripts/nats-env does)"
            ))
        })?;
        node.child = Some(child);
        Ok(())
    }

    fn wait_ready(&mut self, index: usize) -> Result<(), ClusterError> {
        let started = Instant::now();
        let node = &mut self.nodes[index];
        while started.elapsed() < NODE_START_TIMEOUT {
            if healthy(node.monitor_port) {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = node.child.as_mut().map(Child::try_wait) {
                let why = format!("node {} exited at start ({status}): ports taken?", node.name);
                return Err(ClusterError(why));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(ClusterError(format!("node {} did not start", node.name)))
    }
}

/// Whether the node's `/healthz` answers 200: it accepts clients and its JetStream is current
/// (in a cluster: a meta leader is known and its assets are caught up).
fn healthy(monitor_port: u16) -> bool {
    let monitor = std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, monitor_port));
    ops::endpoint::get(monitor, "/healthz").is_ok_and(|(status, _)| status == 200)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for index in 0..self.nodes.len() {
            self.kill(index);
        }
    }
}
