//! Proofs of a right to a lane: access codes (stored as their hash, never as sent) and lane
//! claims the shop signs. Pure: the caller passes the time; Redis is the store's business.
//!
//! A claim, sent in `X-VQ-Lane` (or the enter body's `laneClaim`), is
//! `<lane>.<expiresAtEpochSec>.<hex HMAC-SHA256(key, "vq-lane-v1|TYPE:id|lane|user|expiresAtEpochSec")>`,
//! the key being the type's `lane_secret_env`: it names the target, the lane and the user it was
//! made for, so it proves nothing for another target, lane or user, nor after its expiry.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::domain::{LaneName, QueueTarget, UserId};

type HmacSha256 = Hmac<Sha256>;

/// The longest access code taken, in bytes.
pub const MAX_CODE_LEN: usize = 128;

/// The hash an access code is stored and looked up by: hex SHA-256 of the target and the
/// code (`TYPE:id` and the code, a newline between), so a code's hash says nothing about the
/// same code for another target.
pub fn code_hash(target: QueueTarget, code: &str) -> String {
    let mut h = Sha256::new();
    h.update(target.whole().to_string().as_bytes());
    h.update(b"\n");
    h.update(code.as_bytes());
    crate::domain::hex(&h.finalize())
}

/// Whether `code` is an access code vq takes: 1 to 128 visible ASCII characters.
pub fn is_code(code: &str) -> bool {
    (1..=MAX_CODE_LEN).contains(&code.len()) && code.bytes().all(|b| b.is_ascii_graphic())
}

/// Why a lane claim proves nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error("the lane claim is not <lane>.<expiresAtEpochSec>.<hex signature>")]
    Malformed,
    #[error("lane claims are not taken for this target's type (no lane_secret_env set)")]
    NoKey,
    #[error("the lane claim's signature is not valid for this target, user and lane")]
    BadSignature,
    #[error("the lane claim expired at {0} (epoch seconds)")]
    Expired(u64),
}

fn payload(target: QueueTarget, lane: &str, user: &UserId, expires_at: u64) -> String {
    format!("vq-lane-v1|{}|{lane}|{user}|{expires_at}", target.whole())
}

/// A claim for `user` to `lane` of `target` until `expires_at` (epoch seconds), signed with
/// `key`: what the shop's side computes (tests and `vq lane claim` use it).
pub fn sign_claim(key: &[u8], target: QueueTarget, lane: LaneName, user: &UserId, expires_at: u64) -> String {
    let mut mac = HmacSha256::new_from_slice(key).expect("hmac accepts keys of any length");
    mac.update(payload(target, lane.as_str(), user, expires_at).as_bytes());
    format!("{}.{expires_at}.{}", lane.as_str(), crate::domain::hex(&mac.finalize().into_bytes()))
}

/// The lane `claim` proves `user` may join at `target`, checked with `key` at `now_s`.
pub fn verify_claim(
    key: Option<&[u8]>,
    target: QueueTarget,
    user: &UserId,
    claim: &str,
    now_s: u64,
) -> Result<LaneName, ClaimError> {
    let mut it = claim.trim().splitn(3, '.');
    let (Some(lane), Some(exp), Some(sig)) = (it.next(), it.next(), it.next()) else {
        return Err(ClaimError::Malformed);
    };
    let lane: LaneName = lane.parse().map_err(|_| ClaimError::Malformed)?;
    let expires_at: u64 = exp.parse().map_err(|_| ClaimError::Malformed)?;
    let sig = crate::domain::unhex(sig).filter(|s| s.len() == 32).ok_or(ClaimError::Malformed)?;
    let key = key.ok_or(ClaimError::NoKey)?;
    let mut mac = HmacSha256::new_from_slice(key).expect("hmac accepts keys of any length");
    mac.update(payload(target, lane.as_str(), user, expires_at).as_bytes());
    mac.verify_slice(&sig).map_err(|_| ClaimError::BadSignature)?;
    if expires_at <= now_s {
        return Err(ClaimError::Expired(expires_at));
    }
    Ok(lane)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_proves_its_lane_for_its_user_and_target_until_it_expires() {
        let t: QueueTarget = "limited-drop:42".parse().unwrap();
        let other_t: QueueTarget = "limited-drop:43".parse().unwrap();
        let (u, v): (UserId, UserId) = ("alice".parse().unwrap(), "bob".parse().unwrap());
        let members: LaneName = "members".parse().unwrap();
        let key = b"shop-lane-key".as_slice();
        let c = sign_claim(key, t, members, &u, 2000);
        assert_eq!(verify_claim(Some(key), t, &u, &c, 1000), Ok(members));
        assert_eq!(verify_claim(Some(key), t, &v, &c, 1000), Err(ClaimError::BadSignature), "another user");
        assert_eq!(verify_claim(Some(key), other_t, &u, &c, 1000), Err(ClaimError::BadSignature), "another target");
        assert_eq!(verify_claim(Some(b"other"), t, &u, &c, 1000), Err(ClaimError::BadSignature), "forged");
        let other_lane = c.replacen("members", "vip", 1);
        assert_eq!(verify_claim(Some(key), t, &u, &other_lane, 1000), Err(ClaimError::BadSignature), "another lane");
        assert_eq!(verify_claim(Some(key), t, &u, &c, 2000), Err(ClaimError::Expired(2000)));
        assert_eq!(verify_claim(None, t, &u, &c, 1000), Err(ClaimError::NoKey));
        for bad in ["", "members", "members.x.00", "members.1.zz", "Members.2000.00"] {
            assert_eq!(verify_claim(Some(key), t, &u, bad, 1000), Err(ClaimError::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn a_code_is_hashed_with_its_target() {
        let t: QueueTarget = "limited-drop:42".parse().unwrap();
        let other: QueueTarget = "limited-drop:43".parse().unwrap();
        assert_eq!(code_hash(t, "ABC"), code_hash(t, "ABC"));
        assert_ne!(code_hash(t, "ABC"), code_hash(other, "ABC"));
        assert_eq!(code_hash(t, "ABC").len(), 64);
        assert!(is_code("FAN-2026-XYZ") && !is_code("") && !is_code("a b") && !is_code(&"a".repeat(129)));
    }
}
