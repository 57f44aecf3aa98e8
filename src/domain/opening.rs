//! The fair opening order of a sale's pre-queue, and its seed's commitment.
//!
//! Pure: the seed is passed in (the store draws it). The order is HMAC-SHA256(key = seed,
//! message = the user id's characters as sent), ascending as unsigned big-endian bytes, so anyone
//! holding the seed and the list of pre-queued users can recompute it.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::UserId;

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes of lowercase or uppercase hex; `None` if it is not hex.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// Lowercase hex SHA-256 of the seed bytes: what is published before the opening.
pub fn seed_commitment(seed: &[u8]) -> String {
    hex(&Sha256::digest(seed))
}

/// The opening order: users sorted by HMAC-SHA256(seed, user id as sent), ascending as
/// unsigned big-endian bytes (ties, which need a collision, by user id).
pub fn opening_order(seed: &[u8], users: &[UserId]) -> Vec<UserId> {
    let mut keyed: Vec<([u8; 32], UserId)> = users
        .iter()
        .map(|u| {
            let mut mac = Hmac::<Sha256>::new_from_slice(seed).expect("hmac accepts keys of any length");
            mac.update(u.as_str().as_bytes());
            (mac.finalize().into_bytes().into(), u.clone())
        })
        .collect();
    keyed.sort_unstable();
    keyed.dedup_by(|a, b| a.1 == b.1);
    keyed.into_iter().map(|(_, u)| u).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_order_sorts_by_hmac() {
        let seed = [7u8; 32];
        let users: Vec<UserId> = (1..=50).map(UserId::from).collect();
        let order = opening_order(&seed, &users);
        assert_eq!(order.len(), 50);
        let mac = |u: &UserId| {
            let mut m = Hmac::<Sha256>::new_from_slice(&seed).unwrap();
            m.update(u.as_str().as_bytes());
            m.finalize().into_bytes().to_vec()
        };
        assert!(order.windows(2).all(|w| mac(&w[0]) < mac(&w[1])));
        assert_ne!(order, users, "the order is not the arrival order");
        let mut reversed = users.clone();
        reversed.reverse();
        assert_eq!(opening_order(&seed, &reversed), order, "independent of the input order");
    }

    #[test]
    fn hex_round_trips_and_commits() {
        assert_eq!(hex(&unhex("00ff10").unwrap()), "00ff10");
        assert_eq!(seed_commitment(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
