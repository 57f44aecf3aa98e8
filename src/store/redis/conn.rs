//! The connection every command goes through: one server (`ConnectionManager`), a lazily
//! opened cluster connection or the embedded server in this process (`store/embedded/`), behind
//! one `ConnectionLike`; and whether the server runs vq's scripts as functions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use crate::store::embedded::{Embedded, Reply};

/// After a failed attempt to reach the cluster, commands fail at once for this long.
pub(super) const CLUSTER_RETRY_AFTER: Duration = Duration::from_millis(500);

/// After Redis refused functions (`FCALL` or `FUNCTION LOAD`: an older Redis, an ACL without
/// them, a library that failed to load), scripts go as EVALSHA for this long, then functions
/// are tried again (one refused call, answered through EVALSHA, per period).
pub(super) const FUNCTIONS_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The connection every command goes through: one server, or a cluster (each command routed
/// to the node owning its key's slot; `SCRIPT LOAD` after NOSCRIPT goes to every primary,
/// `FUNCTION LOAD` to the node of the call's key, see `scripts.rs`).
#[derive(Clone)]
pub(super) struct Conn {
    link: Link,
    /// Until when (ms since [`EPOCH`]) scripts go as EVALSHA; 0: as functions.
    evalsha_until: Arc<AtomicU64>,
}

#[derive(Clone)]
enum Link {
    Single(ConnectionManager),
    Cluster(Arc<LazyCluster>),
    /// The embedded server in this process (`store/embedded/`): `--store memory`.
    Embedded(Embedded),
}

/// The instant [`Conn::evalsha_until`] counts from.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn since_epoch_ms() -> u64 {
    u64::try_from(EPOCH.elapsed().as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Conn {
    pub(super) fn single(conn: ConnectionManager) -> Self {
        Self { link: Link::Single(conn), evalsha_until: Arc::default() }
    }

    pub(super) fn cluster(cluster: LazyCluster) -> Self {
        Self { link: Link::Cluster(Arc::new(cluster)), evalsha_until: Arc::default() }
    }

    pub(super) fn embedded(server: Embedded) -> Self {
        Self { link: Link::Embedded(server), evalsha_until: Arc::default() }
    }

    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.link, Link::Cluster(_))
    }

    /// Whether scripts go as functions (`FCALL`) now, rather than as EVALSHA.
    pub(super) fn runs_functions(&self) -> bool {
        let until = self.evalsha_until.load(Ordering::Relaxed);
        until == 0 || since_epoch_ms() >= until
    }

    /// Redis refused functions: EVALSHA for [`FUNCTIONS_RETRY_AFTER`].
    pub(super) fn refuse_functions(&self) {
        let until = since_epoch_ms().saturating_add(FUNCTIONS_RETRY_AFTER.as_millis() as u64);
        self.evalsha_until.store(until, Ordering::Relaxed);
    }

    /// Sends `cmd` to the node that serves `key` (a cluster's primary of its slot; the one
    /// server otherwise); an error reply is an error.
    pub(super) async fn on_node_of(&mut self, key: Option<&[u8]>, cmd: &Cmd) -> RedisResult<Value> {
        let reply = match (&self.link, key) {
            (Link::Cluster(lazy), Some(key)) => {
                let mut c = lazy.get().await?;
                let route = Route::with_key(key, SlotAddr::Master);
                c.route_command(cmd.clone(), RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route))).await
            }
            _ => self.req_packed_command(cmd).await,
        };
        reply.and_then(Value::extract_error)
    }
}

pub(super) struct LazyCluster {
    pub(super) client: ClusterClient,
    /// Set once the slot map was read; the connection then follows the cluster by itself.
    pub(super) conn: tokio::sync::OnceCell<ClusterConnection>,
    /// Last failed attempt to open `conn`, for [`CLUSTER_RETRY_AFTER`].
    pub(super) failed_at: Mutex<Option<Instant>>,
    pub(super) timeout: Duration,
}

impl LazyCluster {
    async fn get(&self) -> Result<ClusterConnection, RedisError> {
        if let Some(c) = self.conn.get() {
            return Ok(c.clone());
        }
        let recent_failure =
            self.failed_at.lock().map(|f| f.is_some_and(|at| at.elapsed() < CLUSTER_RETRY_AFTER)).unwrap_or(false);
        if recent_failure {
            return Err(io_error(std::io::ErrorKind::NotConnected, "redis cluster unreachable (retrying shortly)"));
        }
        let opened = self
            .conn
            .get_or_try_init(|| async {
                // Opening reads the slot map from the nodes: a few round trips.
                match tokio::time::timeout(self.timeout * 4, self.client.get_async_connection()).await {
                    Ok(r) => r,
                    Err(_) => Err(io_error(std::io::ErrorKind::TimedOut, "redis cluster connect timed out")),
                }
            })
            .await;
        match opened {
            Ok(c) => Ok(c.clone()),
            Err(e) => {
                if let Ok(mut f) = self.failed_at.lock() {
                    *f = Some(Instant::now());
                }
                Err(e)
            }
        }
    }
}

fn io_error(kind: std::io::ErrorKind, msg: &'static str) -> RedisError {
    RedisError::from(std::io::Error::new(kind, msg))
}

/// A command's words, as the embedded server takes them.
fn words(cmd: &Cmd) -> Vec<Vec<u8>> {
    cmd.args_iter()
        .filter_map(|a| match a {
            redis::Arg::Simple(b) => Some(b.to_vec()),
            _ => None,
        })
        .collect()
}

/// A pipeline's answers as a server sends them (`MULTI`'s `OK` and one `QUEUED` per command
/// before `EXEC`'s array in a transaction), `count` of them from `offset`.
async fn embedded_pipeline(
    server: &Embedded,
    pipeline: &Pipeline,
    offset: usize,
    count: usize,
) -> RedisResult<Vec<Value>> {
    let replies: Vec<Value> =
        server.run(pipeline.cmd_iter().map(words).collect()).await.into_iter().map(Reply::into_value).collect();
    let all = if pipeline.is_transaction() {
        let mut all = vec![Value::Okay];
        all.extend(replies.iter().map(|_| Value::SimpleString("QUEUED".into())));
        all.push(Value::Array(replies));
        all
    } else {
        replies
    };
    Ok(all.into_iter().skip(offset).take(count).collect())
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.link {
            Link::Single(c) => c.req_packed_command(cmd),
            Link::Embedded(server) => Box::pin(async move {
                match server.one(words(cmd)).await.into_value() {
                    Value::ServerError(e) => Err(e.into()),
                    v => Ok(v),
                }
            }),
            Link::Cluster(lazy) => Box::pin(async move {
                let mut c = lazy.get().await?;
                c.req_packed_command(cmd).await
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.link {
            Link::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Embedded(server) => Box::pin(embedded_pipeline(server, pipeline, offset, count)),
            Link::Cluster(lazy) => Box::pin(async move {
                let mut c = lazy.get().await?;
                c.req_packed_commands(pipeline, offset, count).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.link {
            Link::Single(c) => c.get_db(),
            Link::Cluster(_) | Link::Embedded(_) => 0,
        }
    }
}
