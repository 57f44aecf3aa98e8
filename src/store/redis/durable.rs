//! Writes a failover must not lose: a token handed to a buyer and a purchase's claim are
//! answered for only once the primary's replicas acknowledged them (`WAIT`).
//!
//! `WAIT` waits for the writes of the connection it is sent on, and blocks that connection
//! meanwhile: so it goes on a connection of its own (one per node on a cluster), never on the
//! one every other command shares. There, a *round* is `SET queue:{T}:replicated` (a write to
//! the target's node, so the round's offset is past every write that node answered before)
//! then `WAIT n timeout`: an acknowledgement of the round covers every write answered before
//! it was sent, whichever connection made it. A caller takes a ticket once its write (or the
//! read that found a stored token) was answered and is covered by the first round that starts
//! after that; callers that arrive while a round is in flight share the next one (a group
//! commit per target), so a batch of tokens issued in one tick costs a round or two.
//!
//! How many replicas: `redis.wait_replicas`, a number or `"auto"` (those the primary has
//! connected, counted by the probe: `pulse.rs`). No replica wanted: no round at all.
//!
//! Must not: send `WAIT` on the shared connection, or answer "replicated" for a round that
//! started before the caller's write was answered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::conn::Conn;
use super::keys;
use super::pulse::Pulse;
use crate::domain::QueueTarget;
use crate::store::{DurableWrites, ReplicaWait, StoreError};

/// How long the round's marker key lives (it only needs to be written).
const MARKER_TTL_MS: u64 = 60_000;

pub(super) struct Durable {
    /// A connection for rounds only: `WAIT` blocks the connection it is sent on.
    conn: Conn,
    writes: DurableWrites,
    groups: Mutex<HashMap<QueueTarget, Arc<Group>>>,
}

/// One target's group commit.
#[derive(Default)]
struct Group {
    /// Tickets handed out: the n-th caller's write was answered before it took ticket n.
    tickets: AtomicU64,
    /// The last round: the tickets it covers and what it found. Held while a round runs, so
    /// the callers that arrive meanwhile queue for the next one.
    last: tokio::sync::Mutex<Round>,
}

#[derive(Default)]
struct Round {
    covered: u64,
    result: Option<Result<(), StoreError>>,
}

impl Durable {
    pub(super) fn new(conn: Conn, writes: DurableWrites) -> Self {
        Self { conn, writes, groups: Mutex::default() }
    }

    /// Returns once the replicas hold every write the target's node answered before this
    /// call; [`StoreError::NotReplicated`] when they do not within `redis.wait_timeout_ms`.
    pub(super) async fn confirm(&self, target: QueueTarget, pulse: &Pulse) -> Result<(), StoreError> {
        let wanted = match self.writes.replicas {
            ReplicaWait::Count(n) => n,
            ReplicaWait::Auto => pulse.replicas(target),
        };
        if wanted == 0 {
            return Ok(());
        }
        let group = {
            let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
            groups.entry(target).or_default().clone()
        };
        let ticket = group.tickets.fetch_add(1, Ordering::SeqCst) + 1;
        let mut last = group.last.lock().await;
        if last.covered >= ticket
            && let Some(result) = &last.result
        {
            return result.clone();
        }
        // Every ticket up to here belongs to a write answered before the round is sent.
        let covered = group.tickets.load(Ordering::SeqCst);
        let result = self.round(target, wanted).await;
        *last = Round { covered, result: Some(result.clone()) };
        result
    }

    async fn round(&self, target: QueueTarget, wanted: u64) -> Result<(), StoreError> {
        let (acked,): (u64,) = redis::pipe()
            .cmd("SET")
            .arg(keys::of(target, "replicated"))
            .arg(1)
            .arg("PX")
            .arg(MARKER_TTL_MS)
            .ignore()
            .cmd("WAIT")
            .arg(wanted)
            .arg(self.writes.timeout_ms)
            .query_async(&mut self.conn.clone())
            .await?;
        if acked >= wanted { Ok(()) } else { Err(StoreError::NotReplicated { acked, wanted }) }
    }
}
