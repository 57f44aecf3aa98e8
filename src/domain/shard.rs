//! One target spread over N shards (`shards` of a `[[targets.types]]` entry): which shard a
//! user belongs to, which Redis Cluster slot range each shard's hash tag is chosen in, and how
//! one tick's batch is shared out between the shards.
//!
//! Pure: no IO, no clock. The store (`store/redis/`) names the keys; this decides the numbers.

/// Redis Cluster's slot count.
pub const CLUSTER_SLOTS: u16 = 16384;

/// The most shards a target type may have.
pub const MAX_SHARDS: u8 = 64;

/// Which part of a target a value names: the whole target (`count == 0`, what everything
/// outside the Redis store sees), or shard `index` of `count` (the store's own, to name one
/// shard's keys).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shard {
    pub index: u8,
    pub count: u8,
    /// The lane this part belongs to (`domain::LaneName::PUBLIC`: the target's own, the only
    /// one of a target without lanes).
    pub lane: super::LaneName,
}

impl Shard {
    /// The whole target.
    pub const WHOLE: Shard = Shard { index: 0, count: 0, lane: super::LaneName::PUBLIC };

    pub fn is_whole(&self) -> bool {
        self.count == 0
    }

    /// The target's own part: shard 0 of the public lane (or the whole target), which holds
    /// the target-wide state (lock, plan, pinned batch, event log).
    pub fn is_first(&self) -> bool {
        self.index == 0 && self.lane.is_public()
    }
}

/// The shard of `user` in a target of `count` shards: FNV-1a (64-bit) of the user id's bytes,
/// modulo `count`. Fixed for good (a changed function would move waiting users between
/// shards): every instance and version puts a user in the same shard, so a re-enter from
/// another instance finds the user's place.
pub fn user_shard(user: &str, count: u8) -> u8 {
    if count <= 1 {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in user.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % u64::from(count)) as u8
}

/// CRC16-CCITT (XModem), the checksum Redis Cluster's key slots are made of.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for b in bytes {
        crc ^= u16::from(*b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The cluster slot of a key whose hash tag is `tag` (the text between `{` and `}`).
pub fn tag_slot(tag: &str) -> u16 {
    crc16(tag.as_bytes()) % CLUSTER_SLOTS
}

/// Which of `count` equal ranges of slots `slot` falls in (`redis-cli --cluster create`
/// gives its nodes such contiguous ranges).
pub fn slot_range(slot: u16, count: u8) -> u8 {
    (u32::from(slot) * u32::from(count) / u32::from(CLUSTER_SLOTS)) as u8
}

/// The hash tag of shard `index` (of `count`) of the target whose own tag is `target` (its
/// `TYPE:id`). Shard 0 keeps `target` (a 1-shard target's keys are unchanged); shard s ≥ 1 is
/// `target#s.k`, with the smallest k that puts its slot in range (r₀ + s) mod count, r₀ being
/// shard 0's range: the shards fall in `count` different ranges, so on a cluster whose nodes
/// hold equal ranges, `count` shards are on `count` nodes.
pub fn shard_tag(target: &str, index: u8, count: u8) -> String {
    if index == 0 || count <= 1 {
        return target.to_owned();
    }
    let want = (slot_range(tag_slot(target), count) + index) % count;
    (0u32..)
        .map(|k| format!("{target}#{index}.{k}"))
        .find(|tag| slot_range(tag_slot(tag), count) == want)
        .expect("some suffix lands in every range")
}

/// The cap of shard `index`: `cap` split so the shards' caps add up to it exactly (the first
/// `cap % count` shards take one more).
pub fn shard_cap(cap: u64, index: u8, count: u8) -> u64 {
    if count <= 1 {
        return cap;
    }
    let n = u64::from(count);
    cap / n + u64::from(u64::from(index) < cap % n)
}

/// One tick's allotment per shard: at most `batch` in all. While more wait than the batch,
/// shares proportional to each shard's waiting users (largest remainder, ties to the lower
/// shard); otherwise each shard's waiting users, and the room left spread evenly, so users
/// arriving meanwhile are admitted this tick too.
pub fn allot(batch: u64, waiting: &[u64]) -> Vec<u64> {
    let n = waiting.len() as u64;
    if n == 0 {
        return Vec::new();
    }
    let total: u64 = waiting.iter().sum();
    if total <= batch {
        let room = batch - total;
        return waiting.iter().enumerate().map(|(i, w)| w + room / n + u64::from((i as u64) < room % n)).collect();
    }
    let exact: Vec<(u64, u128)> = waiting
        .iter()
        .map(|w| {
            let p = u128::from(*w) * u128::from(batch);
            ((p / u128::from(total)) as u64, p % u128::from(total))
        })
        .collect();
    let mut out: Vec<u64> = exact.iter().map(|(q, _)| *q).collect();
    let left = batch - out.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by(|a, b| exact[*b].1.cmp(&exact[*a].1).then(a.cmp(b)));
    for i in order.into_iter().take(left as usize) {
        out[i] += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // Redis' own CLUSTER KEYSLOT answers: foo 12182, {user1000}.following 3443.
        assert_eq!(tag_slot("foo"), 12182);
        assert_eq!(tag_slot("user1000"), 3443);
        assert_eq!(tag_slot("123456789"), 0x31C3 % CLUSTER_SLOTS);
    }

    #[test]
    fn a_user_stays_in_one_shard_and_the_function_is_fixed() {
        assert_eq!(user_shard("anyone", 1), 0);
        // FNV-1a of "a" is 0xaf63dc4c8601ec8c: fixed values, never to change.
        assert_eq!(user_shard("a", 3), (0xaf63_dc4c_8601_ec8c_u64 % 3) as u8);
        let spread: Vec<u64> = (0..3000).fold(vec![0; 3], |mut c, i| {
            c[user_shard(&format!("user-{i}"), 3) as usize] += 1;
            c
        });
        assert!(spread.iter().all(|c| (800..1200).contains(c)), "users spread over the shards: {spread:?}");
    }

    #[test]
    fn each_shard_tag_lands_in_its_own_slot_range() {
        for count in [2u8, 3, 5, 16] {
            for id in 1..50 {
                let target = format!("LIMITED_DROP:{id}");
                let ranges: std::collections::BTreeSet<u8> =
                    (0..count).map(|s| slot_range(tag_slot(&shard_tag(&target, s, count)), count)).collect();
                assert_eq!(ranges.len(), count as usize, "{target} over {count} shards");
            }
        }
        assert_eq!(shard_tag("LIMITED_DROP:7", 0, 3), "LIMITED_DROP:7");
        assert_eq!(shard_tag("LIMITED_DROP:7", 2, 1), "LIMITED_DROP:7");
        assert!(shard_tag("LIMITED_DROP:7", 2, 3).starts_with("LIMITED_DROP:7#2."));
    }

    #[test]
    fn shard_caps_add_up_to_the_cap() {
        for cap in [1u64, 2, 10, 100_001] {
            for count in [1u8, 2, 3, 7] {
                assert_eq!((0..count).map(|s| shard_cap(cap, s, count)).sum::<u64>(), cap);
            }
        }
    }

    #[test]
    fn the_allotment_never_exceeds_the_batch_and_follows_the_waiting() {
        assert_eq!(allot(10, &[100, 100, 100]), vec![4, 3, 3]);
        assert_eq!(allot(10, &[0, 50, 0]), vec![0, 10, 0]);
        assert_eq!(allot(10, &[1, 2, 0]), vec![4, 4, 2]);
        assert_eq!(allot(100, &[1000, 10, 1]), vec![99, 1, 0]);
        for batch in [0u64, 1, 7, 100] {
            for w in [[0u64, 0, 0], [5, 0, 9], [1000, 1, 1], [33, 33, 34]] {
                let a = allot(batch, &w);
                assert_eq!(a.iter().sum::<u64>(), batch, "{batch} over {w:?}: {a:?}");
            }
        }
    }
}
