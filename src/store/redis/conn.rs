//! The connection every command goes through: one server (`ConnectionManager`) or a lazily
//! opened cluster connection, behind one `ConnectionLike`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

/// After a failed attempt to reach the cluster, commands fail at once for this long.
pub(super) const CLUSTER_RETRY_AFTER: Duration = Duration::from_millis(500);

/// The connection every command goes through: one server, or a cluster (each command routed
/// to the node owning its key's slot; `SCRIPT LOAD` after NOSCRIPT goes to every primary).
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(Arc<LazyCluster>),
}

impl Conn {
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
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

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(lazy) => Box::pin(async move {
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
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(lazy) => Box::pin(async move {
                let mut c = lazy.get().await?;
                c.req_packed_commands(pipeline, offset, count).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(_) => 0,
        }
    }
}
