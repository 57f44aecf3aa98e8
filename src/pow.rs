//! Proof of work at entry (`entry.pow_bits`): a place costs a few hundred thousand SHA-256
//! evaluations, which a buyer's browser pays once and a bot pays per place.
//!
//! A challenge is a seed vq signs and never stores: `rand "." expiresAt "." bits "." sig`,
//! with `rand` 16 random bytes in base64url, `expiresAt` in epoch seconds, and `sig` =
//! base64url(HMAC-SHA256(secret, "vq-pow|" rand "|" expiresAt "|" bits "|" TYPE:ID "|" user)),
//! so a seed is good for one user and target only. The client finds a nonce (1 to 64
//! characters of letters and digits) such that SHA-256(seed ‖ nonce), the two strings' bytes
//! one after the other, starts with `bits` zero bits. vq checks it with one hash and the
//! signature; that a seed is used once is the store's part ([`PowSolution::id`]).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

use crate::domain::{QueueTarget, UserId};
use crate::token::Secret;

/// A challenge as handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub seed: String,
    pub bits: u8,
    pub expires_at: u64,
}

/// Why a solution is refused; the text is the `detail` of the 403.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PowError {
    #[error("the proof of work is malformed: {0}")]
    Malformed(&'static str),
    #[error("the challenge was not issued by vq for this user and target")]
    Forged,
    #[error("the challenge expired at {at} (epoch seconds): enter again for a new one")]
    Expired { at: u64 },
    #[error("the challenge asks for {bits} bits, the queue now {needed}: enter again for a new one")]
    TooEasy { bits: u8, needed: u8 },
    #[error("the nonce does not solve the challenge: SHA-256(seed + nonce) must start with {bits} zero bits")]
    NotSolved { bits: u8 },
    #[error("this challenge was already used to enter: enter again for a new one")]
    Reused,
}

/// A checked solution: `id` names its challenge, to refuse a second use until `expires_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PowSolution {
    pub id: String,
    pub expires_at: u64,
}

fn signature(secret: &Secret, rand: &str, expires_at: u64, bits: u8, target: QueueTarget, user: &UserId) -> Vec<u8> {
    secret.sign(format!("vq-pow|{rand}|{expires_at}|{bits}|{target}|{user}").as_bytes()).to_vec()
}

/// A new challenge for `user` at `target`, from 16 random bytes.
pub fn challenge(
    secret: &Secret,
    random: [u8; 16],
    target: QueueTarget,
    user: &UserId,
    bits: u8,
    expires_at: u64,
) -> Challenge {
    let rand = URL_SAFE_NO_PAD.encode(random);
    let sig = URL_SAFE_NO_PAD.encode(signature(secret, &rand, expires_at, bits, target, user));
    Challenge { seed: format!("{rand}.{expires_at}.{bits}.{sig}"), bits, expires_at }
}

/// Whether `nonce` has a nonce's form: 1 to 64 letters and digits.
pub fn is_nonce(nonce: &str) -> bool {
    (1..=64).contains(&nonce.len()) && nonce.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Leading zero bits of a hash.
pub fn leading_zero_bits(hash: &[u8]) -> u32 {
    let mut n = 0;
    for b in hash {
        if *b != 0 {
            return n + b.leading_zeros();
        }
        n += 8;
    }
    n
}

/// Whether `nonce` solves `seed` at `bits`.
pub fn solves(seed: &str, nonce: &str, bits: u8) -> bool {
    let mut h = Sha256::new();
    h.update(seed.as_bytes());
    h.update(nonce.as_bytes());
    leading_zero_bits(&h.finalize()) >= u32::from(bits)
}

/// Checks a solution: well-formed, signed for this user and target, unexpired at `now`, at
/// least `needed` bits, solved. Not whether it was used before (the store knows).
pub fn check(
    secret: &Secret,
    seed: &str,
    nonce: &str,
    target: QueueTarget,
    user: &UserId,
    now: u64,
    needed: u8,
) -> Result<PowSolution, PowError> {
    let mut parts = seed.split('.');
    let (Some(rand), Some(exp), Some(bits), Some(sig), None) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(PowError::Malformed("the seed is not rand.expiresAt.bits.signature"));
    };
    let expires_at: u64 = exp.parse().map_err(|_| PowError::Malformed("bad expiry"))?;
    let bits: u8 = bits.parse().map_err(|_| PowError::Malformed("bad difficulty"))?;
    if !is_nonce(nonce) {
        return Err(PowError::Malformed("the nonce must be 1 to 64 letters and digits"));
    }
    let sig = URL_SAFE_NO_PAD.decode(sig).map_err(|_| PowError::Malformed("bad signature encoding"))?;
    let payload = format!("vq-pow|{rand}|{expires_at}|{bits}|{target}|{user}");
    if !secret.signed(payload.as_bytes(), &sig) {
        return Err(PowError::Forged);
    }
    if expires_at <= now {
        return Err(PowError::Expired { at: expires_at });
    }
    if bits < needed {
        return Err(PowError::TooEasy { bits, needed });
    }
    if !solves(seed, nonce, bits) {
        return Err(PowError::NotSolved { bits });
    }
    Ok(PowSolution { id: rand.to_owned(), expires_at })
}

/// Finds a nonce for `seed` at `bits` (loadgen, tests): the nonce and the hashes tried.
pub fn solve(seed: &str, bits: u8) -> (String, u64) {
    use std::fmt::Write;
    let mut prefix = Sha256::new();
    prefix.update(seed.as_bytes());
    // One buffer for every nonce: no allocation per hash.
    let mut nonce = String::with_capacity(20);
    for n in 0u64.. {
        nonce.clear();
        let _ = write!(nonce, "{n}");
        let mut h = prefix.clone();
        h.update(nonce.as_bytes());
        if leading_zero_bits(&h.finalize()) >= u32::from(bits) {
            return (nonce, n + 1);
        }
    }
    unreachable!("u64 nonces run out only after 2^64 hashes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Secret {
        Secret::new(vec![b's'; 40]).unwrap()
    }

    fn t() -> QueueTarget {
        "LIMITED_DROP:42".parse().unwrap()
    }

    #[test]
    fn a_solved_challenge_checks_and_every_kind_of_bad_one_says_why() {
        let (s, u) = (secret(), UserId::from(7));
        let c = challenge(&s, [1; 16], t(), &u, 8, 1000);
        let (nonce, tries) = solve(&c.seed, 8);
        assert!(tries >= 1 && solves(&c.seed, &nonce, 8));
        let ok = check(&s, &c.seed, &nonce, t(), &u, 999, 8).unwrap();
        assert_eq!(ok.expires_at, 1000);
        assert_eq!(check(&s, &c.seed, &nonce, t(), &u, 1000, 8), Err(PowError::Expired { at: 1000 }));
        assert_eq!(check(&s, &c.seed, &nonce, t(), &UserId::from(8), 999, 8), Err(PowError::Forged));
        let other: QueueTarget = "LIMITED_DROP:43".parse().unwrap();
        assert_eq!(check(&s, &c.seed, &nonce, other, &u, 999, 8), Err(PowError::Forged));
        assert_eq!(
            check(&Secret::new(vec![b'x'; 40]).unwrap(), &c.seed, &nonce, t(), &u, 999, 8),
            Err(PowError::Forged)
        );
        // The difficulty in the seed is signed: lowering it forges the seed.
        let easier = c.seed.replace(".8.", ".1.");
        assert_eq!(check(&s, &easier, &nonce, t(), &u, 999, 1), Err(PowError::Forged));
        assert_eq!(check(&s, &c.seed, &nonce, t(), &u, 999, 9), Err(PowError::TooEasy { bits: 8, needed: 9 }));
        let wrong = (0u64..).map(|n| n.to_string()).find(|n| !solves(&c.seed, n, 8)).unwrap();
        assert_eq!(check(&s, &c.seed, &wrong, t(), &u, 999, 8), Err(PowError::NotSolved { bits: 8 }));
        for bad_nonce in ["", "1 2", "a.b", &"1".repeat(65)] {
            assert!(matches!(check(&s, &c.seed, bad_nonce, t(), &u, 999, 8), Err(PowError::Malformed(_))));
        }
        for bad_seed in ["", "a.b.c", "a.1000.8.sig.x", &c.seed.replace(".1000.", ".x.")] {
            assert!(matches!(check(&s, bad_seed, &nonce, t(), &u, 999, 8), Err(PowError::Malformed(_))), "{bad_seed}");
        }
    }

    #[test]
    fn leading_zero_bits_counts_across_bytes() {
        assert_eq!(leading_zero_bits(&[0x80]), 0);
        assert_eq!(leading_zero_bits(&[0x00, 0x10]), 11);
        assert_eq!(leading_zero_bits(&[0, 0]), 16);
    }
}
