//! Release receipts for forward auth: `/gate/verify` claims the entry token before it answers
//! 204, and hands the proxy (never the buyer) a receipt naming that claim. When the purchase
//! API then fails (a 5xx, unreachable, timed out), the proxy sends the receipt to
//! `/gate/release`, which gives the token back, so the buyer can retry.
//!
//! A receipt is `base64url(payload) "." base64url(HMAC-SHA256(secret, payload))`, payload
//! `vq-release|until_ms|nonce|TYPE:id|user|token|previous`: signed (a client cannot make one),
//! valid until `until_ms` (the check plus `gate.timeout_ms`, Redis' clock), used once (its
//! nonce is spent at the release), and only ever undoes the claim it names. The payload starts
//! `vq-release|`, so no other signed thing vq hands out verifies as a receipt. Pure: the caller
//! draws the nonce and reads the clock.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::domain::{QueueTarget, UserId};
use crate::token::Secret;

/// The response header `/gate/verify` puts the receipt in, and the request header
/// `/gate/release` reads it from.
pub const HEADER: &str = "x-vq-release";

/// The header's value when the check claimed nothing (an ungated path, the queue off for the
/// user, Redis down): always sent, so that a proxy copying the header (Caddy 2.6's
/// `copy_headers` writes its placeholder's own text when the header is absent) copies a value.
pub const NONE: &str = "none";

const PREFIX: &str = "vq-release|";

/// One claim made by `/gate/verify`, and what undoing it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// Epoch ms (Redis' clock) after which the receipt releases nothing.
    pub until_ms: u64,
    /// Random, spent at the release: a receipt releases once.
    pub nonce: String,
    pub target: QueueTarget,
    pub user: UserId,
    /// The token the claim marked used.
    pub token: String,
    /// What the user's token key held before the claim (`token_release.lua` puts it back).
    pub previous: Option<String>,
}

/// Why a receipt releases nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    #[error("the release receipt is malformed")]
    Malformed,
    #[error("the release receipt's signature does not match")]
    BadSignature,
    #[error("the release receipt has expired")]
    Expired,
}

/// A nonce from 12 random bytes.
pub fn nonce(random: [u8; 12]) -> String {
    URL_SAFE_NO_PAD.encode(random)
}

fn payload(r: &Receipt) -> String {
    // `previous` is last: whatever it holds, the fields before it split one way (none of
    // them can hold `|`: the nonce is base64url, user ids and tokens never hold it).
    let previous = match &r.previous {
        None => "-".to_owned(),
        Some(p) if *p == r.token => "=".to_owned(),
        Some(p) => format!("+{p}"),
    };
    format!("{PREFIX}{}|{}|{}|{}|{}|{previous}", r.until_ms, r.nonce, r.target, r.user, r.token)
}

/// The receipt's text, signed with the current key.
pub fn sign(secret: &Secret, receipt: &Receipt) -> String {
    let payload = payload(receipt);
    format!("{}.{}", URL_SAFE_NO_PAD.encode(&payload), URL_SAFE_NO_PAD.encode(secret.sign(payload.as_bytes())))
}

/// The claim a receipt names, if one of the keys signed it and `now_ms` is not past it.
pub fn verify(secret: &Secret, raw: &str, now_ms: u64) -> Result<Receipt, ReceiptError> {
    let (payload, sig) = raw.trim().split_once('.').ok_or(ReceiptError::Malformed)?;
    let payload = URL_SAFE_NO_PAD.decode(payload).map_err(|_| ReceiptError::Malformed)?;
    let sig = URL_SAFE_NO_PAD.decode(sig).map_err(|_| ReceiptError::Malformed)?;
    if !secret.signed(&payload, &sig) {
        return Err(ReceiptError::BadSignature);
    }
    let text = String::from_utf8(payload).map_err(|_| ReceiptError::Malformed)?;
    let fields = text.strip_prefix(PREFIX).ok_or(ReceiptError::Malformed)?;
    let parts: Vec<&str> = fields.splitn(6, '|').collect();
    let [until, nonce, target, user, token, previous] = parts.as_slice() else {
        return Err(ReceiptError::Malformed);
    };
    let until_ms: u64 = until.parse().map_err(|_| ReceiptError::Malformed)?;
    if now_ms > until_ms {
        return Err(ReceiptError::Expired);
    }
    let previous = match *previous {
        "-" => None,
        "=" => Some((*token).to_owned()),
        p => Some(p.strip_prefix('+').ok_or(ReceiptError::Malformed)?.to_owned()),
    };
    Ok(Receipt {
        until_ms,
        nonce: (*nonce).to_owned(),
        target: target.parse().map_err(|_| ReceiptError::Malformed)?,
        user: user.parse().map_err(|_| ReceiptError::Malformed)?,
        token: (*token).to_owned(),
        previous,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Secret {
        Secret::new(b"0123456789abcdefghijklmnopqrstuvwxyz".to_vec()).unwrap()
    }

    fn receipt(previous: Option<&str>) -> Receipt {
        Receipt {
            until_ms: 5_000,
            nonce: nonce([7; 12]),
            target: "LIMITED_DROP:1".parse().unwrap(),
            user: "u-1@x".parse().unwrap(),
            token: "abc.def".into(),
            previous: previous.map(str::to_owned),
        }
    }

    #[test]
    fn a_receipt_names_its_claim_until_it_expires() {
        for previous in [None, Some("abc.def"), Some("other.tok"), Some("-"), Some("="), Some("a|b")] {
            let r = receipt(previous);
            let raw = sign(&secret(), &r);
            assert_eq!(verify(&secret(), &raw, 5_000), Ok(r), "{previous:?}");
            assert_eq!(verify(&secret(), &raw, 5_001), Err(ReceiptError::Expired));
        }
    }

    #[test]
    fn an_altered_or_foreign_receipt_releases_nothing() {
        let raw = sign(&secret(), &receipt(None));
        let (payload, sig) = raw.split_once('.').unwrap();
        let text = String::from_utf8(URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
        let later = URL_SAFE_NO_PAD.encode(text.replace("5000", "9999999999999"));
        assert_eq!(verify(&secret(), &format!("{later}.{sig}"), 0), Err(ReceiptError::BadSignature));
        let other = Secret::new(b"zyxwvutsrqponmlkjihgfedcba9876543210".to_vec()).unwrap();
        assert_eq!(verify(&other, &raw, 0), Err(ReceiptError::BadSignature));
        for bad in ["", "x", "a.b.c", "!!.!!"] {
            assert!(verify(&secret(), bad, 0).is_err(), "{bad}");
        }
        // A signed thing of another kind (a visitor token's payload) is not a receipt.
        let visitor = crate::visitor::sign(&secret(), &"v_x".parse().unwrap(), 9_999_999_999);
        assert!(verify(&secret(), &visitor, 0).is_err());
    }
}
