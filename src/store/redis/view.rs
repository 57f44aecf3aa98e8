//! An instance's copy of one target's admission state, and the heartbeats of the polls it
//! answered from that copy (`view.lua`; used by `service::local`).

use redis::Value;

use super::layout::*;
use super::scripts::{VIEW, VIEW_KEYS, on_target};
use super::slices::{VIEW_DEPARTED_MAX, VIEW_USERS_PER_CALL};
use super::{RedisStore, keys};
use crate::domain::{QueueTarget, UserId};
use crate::store::StoreError;

/// What Redis holds for a target, as of one `view.lua` call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetView {
    pub mark: u64,
    pub batch_override: Option<u64>,
    /// Seqs above the mark of users who left or were evicted, ascending: all of them, or the
    /// lowest [`VIEW_DEPARTED_MAX`] when `departed_known_to` says so.
    pub departed: Vec<u64>,
    /// `Some(s)`: more seqs departed than one read returns, and `departed` holds those up to
    /// `s` only, so `ahead` is exact for seqs up to `s` and users behind it ask Redis.
    pub departed_known_to: Option<u64>,
    /// The target's sale is paused (waiting answers say so).
    pub paused: bool,
    /// The sale is closed or not opened yet: every poll asks Redis (`status.lua`).
    pub sale_asks_store: bool,
}

impl TargetView {
    /// Users still waiting ahead of `seq` (exact for this view up to `departed_known_to`: see
    /// the `aheadCount` invariant in ARCHITECTURE.md).
    pub fn ahead(&self, seq: u64) -> u64 {
        let gone = self.departed.partition_point(|&d| d < seq) as u64;
        seq.saturating_sub(self.mark + 1).saturating_sub(gone)
    }
}

/// One synchronisation: the view, and the users among those sent who are not waiting any
/// more (admitted and issued, left, evicted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewSync {
    pub view: TargetView,
    pub gone: Vec<UserId>,
}

impl RedisStore {
    /// Writes a heartbeat (Redis' time) for every user in `polled` still waiting, and reads
    /// the target's view. In calls of [`VIEW_USERS_PER_CALL`] users; the first one reads the view.
    pub async fn sync_view(&self, target: QueueTarget, polled: &[UserId]) -> Result<ViewSync, StoreError> {
        let mut sync = ViewSync::default();
        let mut chunks: Vec<&[UserId]> = polled.chunks(VIEW_USERS_PER_CALL).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        for (i, users) in chunks.into_iter().enumerate() {
            let first = i == 0;
            let mut inv = on_target(&VIEW, target, VIEW_KEYS);
            inv.args(&ViewArgs { departed_max: if first { VIEW_DEPARTED_MAX } else { 0 } });
            for u in users {
                inv.arg(u.as_str());
            }
            let reply: Value = inv.invoke_async(&mut self.conn()).await?;
            let bad = || StoreError::Reply { what: "view.lua", detail: format!("{reply:?}") };
            let Value::Array(items) = &reply else { return Err(bad()) };
            let int = |v: &Value| match v {
                Value::Int(n) => u64::try_from(*n).ok(),
                Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
                _ => None,
            };
            let head: Option<Vec<u64>> = items.iter().take(4).map(int).collect();
            let [mark, batch, g, sale] = head.ok_or_else(bad)?[..] else { return Err(bad()) };
            let g = usize::try_from(g).map_err(|_| bad())?;
            let gone = items.get(4..4 + g).ok_or_else(bad)?;
            for u in gone {
                let Value::BulkString(b) = u else { return Err(bad()) };
                sync.gone.push(std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()).ok_or_else(bad)?);
            }
            let departed: Option<Vec<u64>> = items[4 + g..].iter().map(int).collect();
            let departed = departed.ok_or_else(bad)?;
            if first {
                // A mark below one already seen (a failover lost the admission) is not taken:
                // users between the two were admitted, and polls near the mark ask status.lua,
                // which raises it back.
                self.fences.observe(target, None, mark, None, 0, false);
                let mark = mark.max(self.fences.fence(target).mark);
                let known_to = (departed.len() >= VIEW_DEPARTED_MAX).then(|| departed.last().copied()).flatten();
                // A shard after the first has no pin of its own: the target's is shard 0's.
                let batch = match target.shard.is_first() {
                    true => batch,
                    false => {
                        let pinned: Option<u64> =
                            redis::AsyncCommands::get(&mut self.conn(), keys::of(target.whole(), "batch_size")).await?;
                        pinned.unwrap_or(0)
                    }
                };
                sync.view = TargetView {
                    mark,
                    departed_known_to: known_to,
                    batch_override: (batch > 0).then_some(batch),
                    departed: departed.into_iter().filter(|&d| d > mark).collect(),
                    paused: sale == 1,
                    sale_asks_store: sale == 2,
                };
            }
        }
        Ok(sync)
    }
}
