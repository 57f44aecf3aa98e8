//! Entry tokens: `base64url(payload) "." base64url(HMAC-SHA256(secret, payload))`, no padding,
//! payload `TYPE|id|user|expiresAtEpochSec`, the user id as the shop sent it (its characters
//! never include `|`, see [`crate::domain::is_user_id_byte`]). Pure: the caller passes the time.
//!
//! The format is a public contract: gates written in other languages verify it.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::domain::{QueueTarget, QueueTargetType, USER_ID_RULE, UserId};

type HmacSha256 = Hmac<Sha256>;

/// The shortest secret `vq serve` accepts, in bytes.
pub const MIN_SECRET_LEN: usize = 32;

/// The fewest distinct byte values an operator's secret may have: 32 random bytes, in base64
/// or hex, have far more; a repeated character or word has fewer.
pub const MIN_DISTINCT_BYTES: usize = 8;

/// The HMAC keys: the current secret signs every token; during a key rotation the previous
/// one still verifies the tokens it signed, until they expire. Its `Debug` never prints them.
#[derive(Clone)]
pub struct Secret {
    current: Vec<u8>,
    previous: Option<Vec<u8>>,
}

/// Which of the keys verified a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyUsed {
    Current,
    Previous,
}

impl KeyUsed {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyUsed::Current => "current",
            KeyUsed::Previous => "previous",
        }
    }
}

impl Secret {
    /// Refuses secrets shorter than [`MIN_SECRET_LEN`] bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, SecretError> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_LEN {
            return Err(SecretError::TooShort { origin: "VQ_TOKEN_SECRET".into(), len: bytes.len() });
        }
        Ok(Self { current: bytes, previous: None })
    }

    /// An operator's secret read from `source` (named in errors): at least [`MIN_SECRET_LEN`]
    /// bytes, not only whitespace, and at least [`MIN_DISTINCT_BYTES`] distinct bytes.
    pub fn from_source(bytes: Vec<u8>, source: &str) -> Result<Self, SecretError> {
        let origin = source.to_owned();
        if bytes.len() < MIN_SECRET_LEN {
            return Err(SecretError::TooShort { origin, len: bytes.len() });
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(SecretError::Whitespace { origin });
        }
        let mut seen = [false; 256];
        bytes.iter().for_each(|b| seen[usize::from(*b)] = true);
        let distinct = seen.iter().filter(|s| **s).count();
        if distinct < MIN_DISTINCT_BYTES {
            return Err(SecretError::LowEntropy { origin, distinct });
        }
        Ok(Self { current: bytes, previous: None })
    }

    /// Adds the secret being retired: it verifies tokens, never signs. Refuses one equal to
    /// the current secret (a rotation that forgot to change the current one).
    pub fn with_previous(mut self, previous: Secret) -> Result<Self, SecretError> {
        if previous.current == self.current {
            return Err(SecretError::PreviousIsCurrent);
        }
        self.previous = Some(previous.current);
        Ok(self)
    }

    pub fn has_previous(&self) -> bool {
        self.previous.is_some()
    }

    /// Ids of the keys, current then previous: an HMAC of a fixed text with each, cut to 48
    /// bits. Instances that show the same ids hold the same keys; an id gives nothing of its key.
    pub fn key_ids(&self) -> String {
        let id = |key: &[u8]| {
            let mut mac = Self::mac(key);
            mac.update(b"vq-key-id|");
            let sum: [u8; 32] = mac.finalize().into_bytes().into();
            sum[..6].iter().map(|b| format!("{b:02x}")).collect::<String>()
        };
        match &self.previous {
            Some(previous) => format!("{} (previous {})", id(&self.current), id(previous)),
            None => id(&self.current),
        }
    }

    fn mac(key: &[u8]) -> HmacSha256 {
        HmacSha256::new_from_slice(key).expect("hmac accepts keys of any length")
    }

    /// HMAC-SHA256 of `payload` with the current key. Every signed thing vq hands out starts
    /// its payload its own way (a token with its type in upper case, others with `vq-…|`),
    /// so no signature made for one is valid for another.
    pub(crate) fn sign(&self, payload: &[u8]) -> [u8; 32] {
        let mut mac = Self::mac(&self.current);
        mac.update(payload);
        mac.finalize().into_bytes().into()
    }

    /// Whether one of the keys signed `payload` with `sig` (constant time).
    pub(crate) fn signed(&self, payload: &[u8], sig: &[u8]) -> bool {
        self.key_of(payload, sig).is_some()
    }

    /// Which key signed `payload` with `sig` (each compared in constant time), if any.
    fn key_of(&self, payload: &[u8], sig: &[u8]) -> Option<KeyUsed> {
        let keys = [(KeyUsed::Current, Some(&self.current)), (KeyUsed::Previous, self.previous.as_ref())];
        keys.into_iter().find_map(|(used, key)| {
            let mut mac = Self::mac(key?);
            mac.update(payload);
            mac.verify_slice(sig).is_ok().then_some(used)
        })
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.previous.is_some() { "Secret(***, previous ***)" } else { "Secret(***)" })
    }
}

/// Why no usable secret could be loaded. Names where the secret came from, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error(
        "VQ_TOKEN_SECRET is not set (nor VQ_TOKEN_SECRET_FILE): vq needs a secret of at least 32 bytes to sign entry tokens (e.g. export VQ_TOKEN_SECRET=$(head -c 32 /dev/urandom | base64))"
    )]
    Missing,
    #[error("{origin} is not valid UTF-8: use random bytes in base64 or hex")]
    NotUtf8 { origin: String },
    #[error("{var}={path}: cannot read the secret file: {error}")]
    Unreadable { var: &'static str, path: String, error: String },
    #[error("{origin} is {len} bytes long: it must be at least 32 bytes")]
    TooShort { origin: String, len: usize },
    #[error("{origin} is only whitespace: use random bytes (e.g. head -c 32 /dev/urandom | base64)")]
    Whitespace { origin: String },
    #[error(
        "{origin} has only {distinct} distinct characters (at least 8 needed): use random bytes (e.g. head -c 32 /dev/urandom | base64)"
    )]
    LowEntropy { origin: String, distinct: usize },
    #[error(
        "the previous secret (VQ_TOKEN_SECRET_PREVIOUS) equals VQ_TOKEN_SECRET: set the new secret as VQ_TOKEN_SECRET and the retired one as VQ_TOKEN_SECRET_PREVIOUS"
    )]
    PreviousIsCurrent,
}

/// What a token says, once decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenClaims {
    pub target: QueueTarget,
    pub user: UserId,
    pub expires_at: u64,
}

/// Why a token is refused. The `Display` text is the `detail` of a 403.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("no entry token: send the X-Entry-Token header")]
    Missing,
    #[error("X-User-Id is missing or not a user id: {USER_ID_RULE}")]
    NoUser,
    #[error("the entry token is malformed: {0}")]
    Malformed(&'static str),
    #[error("the entry token's signature does not match")]
    BadSignature,
    #[error("the entry token expired at {at} (epoch seconds)")]
    Expired { at: u64 },
    #[error("the entry token is for {actual}, not {expected}")]
    WrongType { expected: QueueTargetType, actual: QueueTargetType },
    #[error("the entry token is for {actual}, not {expected}")]
    WrongTarget { expected: QueueTarget, actual: QueueTarget },
    #[error("the entry token belongs to another user")]
    WrongUser,
    #[error("the entry token was already used for a purchase")]
    AlreadyUsed,
}

/// A signed token and its expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryToken {
    pub raw: String,
    pub expires_at: u64,
}

/// Signs a token for `user` on `target`, valid until `now + ttl_s`. No Redis involved: this is
/// both the first step of `issueIfAbsent` and the whole of `mintStateless`.
pub fn mint(secret: &Secret, target: QueueTarget, user: &UserId, now: u64, ttl_s: u64) -> EntryToken {
    let expires_at = now + ttl_s;
    let payload = format!("{}|{}|{}|{}", target.kind.as_str(), target.id, user, expires_at);
    let mut mac = Secret::mac(&secret.current);
    mac.update(payload.as_bytes());
    let sig = mac.finalize().into_bytes();
    let raw = format!("{}.{}", URL_SAFE_NO_PAD.encode(&payload), URL_SAFE_NO_PAD.encode(sig));
    EntryToken { raw, expires_at }
}

/// Splits and decodes a token without checking its signature.
pub fn decode(raw: &str) -> Result<(TokenClaims, Vec<u8>, Vec<u8>), TokenError> {
    let (p64, s64) = raw.split_once('.').ok_or(TokenError::Malformed("no `.` separator"))?;
    let payload = URL_SAFE_NO_PAD.decode(p64).map_err(|_| TokenError::Malformed("payload is not base64url"))?;
    let sig = URL_SAFE_NO_PAD.decode(s64).map_err(|_| TokenError::Malformed("signature is not base64url"))?;
    let text = std::str::from_utf8(&payload).map_err(|_| TokenError::Malformed("payload is not text"))?;
    let mut parts = text.split('|');
    let (Some(kind), Some(id), Some(user), Some(exp), None) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed("payload is not TYPE|id|user|expiry"));
    };
    let kind = QueueTargetType::from_name(kind).map_err(|_| TokenError::Malformed("bad target type"))?;
    let target = QueueTarget::from_parts(kind.as_str(), id).map_err(|_| TokenError::Malformed("bad target id"))?;
    let user = user.parse().map_err(|_| TokenError::Malformed("bad user id"))?;
    let expires_at = exp.parse().map_err(|_| TokenError::Malformed("bad expiry"))?;
    Ok((TokenClaims { target, user, expires_at }, payload, sig))
}

/// Checks the signature only (constant time, current key then previous) and returns the
/// claims.
pub fn verify_signature(secret: &Secret, raw: &str) -> Result<TokenClaims, TokenError> {
    verify_signature_with_key(secret, raw).map(|(claims, _)| claims)
}

/// Like [`verify_signature`], saying which key matched.
pub fn verify_signature_with_key(secret: &Secret, raw: &str) -> Result<(TokenClaims, KeyUsed), TokenError> {
    let (claims, payload, sig) = decode(raw)?;
    let used = secret.key_of(&payload, &sig).ok_or(TokenError::BadSignature)?;
    Ok((claims, used))
}

/// Every check of a token: well-formed, signature, expiry, type, target, user.
pub fn verify(
    secret: &Secret,
    raw: &str,
    target: QueueTarget,
    user: &UserId,
    now: u64,
) -> Result<TokenClaims, TokenError> {
    let claims = verify_signature(secret, raw)?;
    if claims.expires_at <= now {
        return Err(TokenError::Expired { at: claims.expires_at });
    }
    if claims.target.kind != target.kind {
        return Err(TokenError::WrongType { expected: target.kind, actual: claims.target.kind });
    }
    if claims.target != target {
        return Err(TokenError::WrongTarget { expected: target, actual: claims.target });
    }
    if claims.user != *user {
        return Err(TokenError::WrongUser);
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Secret {
        Secret::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap()
    }
    fn target() -> QueueTarget {
        "LIMITED_DROP:42".parse().unwrap()
    }

    #[test]
    fn payload_has_the_public_format() {
        let t = mint(&secret(), target(), &UserId::from(7), 1_767_225_300, 300);
        let (p, _) = t.raw.split_once('.').unwrap();
        assert_eq!(URL_SAFE_NO_PAD.decode(p).unwrap(), b"LIMITED_DROP|42|7|1767225600");
        assert!(!t.raw.contains('='));
        assert_eq!(t.expires_at, 1_767_225_600);
    }

    #[test]
    fn valid_token_verifies() {
        let t = mint(&secret(), target(), &UserId::from(7), 1000, 300);
        let c = verify(&secret(), &t.raw, target(), &UserId::from(7), 1299).unwrap();
        assert_eq!(c.user, UserId::from(7));
    }

    #[test]
    fn each_failure_says_why() {
        let s = secret();
        let t = mint(&s, target(), &UserId::from(7), 1000, 300).raw;
        assert_eq!(verify(&s, &t, target(), &UserId::from(7), 1300), Err(TokenError::Expired { at: 1300 }));
        assert_eq!(verify(&s, &t, target(), &UserId::from(8), 1000), Err(TokenError::WrongUser));
        let other: QueueTarget = "LIMITED_DROP:43".parse().unwrap();
        assert!(matches!(verify(&s, &t, other, &UserId::from(7), 1000), Err(TokenError::WrongTarget { .. })));
        let event: QueueTarget = "TICKETING_EVENT:42".parse().unwrap();
        assert!(matches!(verify(&s, &t, event, &UserId::from(7), 1000), Err(TokenError::WrongType { .. })));
        let other_secret = Secret::new(b"abcdefghijklmnopqrstuvwxyz012345".to_vec()).unwrap();
        assert_eq!(verify(&other_secret, &t, target(), &UserId::from(7), 1000), Err(TokenError::BadSignature));
        assert!(matches!(verify(&s, "garbage", target(), &UserId::from(7), 1000), Err(TokenError::Malformed(_))));
        // Tampered payload: same signature, user changed.
        let (_, sig) = t.split_once('.').unwrap();
        let forged = format!("{}.{sig}", URL_SAFE_NO_PAD.encode("LIMITED_DROP|42|8|1300"));
        assert_eq!(verify(&s, &forged, target(), &UserId::from(8), 1000), Err(TokenError::BadSignature));
    }

    #[test]
    fn short_secret_is_refused_and_never_printed() {
        assert!(matches!(Secret::new(b"short".to_vec()).unwrap_err(), SecretError::TooShort { len: 5, .. }));
        assert_eq!(format!("{:?}", secret()), "Secret(***)");
    }

    #[test]
    fn secrets_without_entropy_are_refused_naming_the_source() {
        let from = |b: &[u8]| Secret::from_source(b.to_vec(), "VQ_TOKEN_SECRET");
        assert!(matches!(from(&[b' '; 33]), Err(SecretError::Whitespace { .. })));
        assert!(matches!(
            from(b" \t\n \t\n \t\n \t\n \t\n \t\n \t\n \t\n \t\n \t\n \t\n"),
            Err(SecretError::Whitespace { .. })
        ));
        assert!(matches!(from(&[b'x'; 64]), Err(SecretError::LowEntropy { distinct: 1, .. })));
        assert!(matches!(
            from(b"abcabcabcabcabcabcabcabcabcabcabcabc"),
            Err(SecretError::LowEntropy { distinct: 3, .. })
        ));
        let err = from(b"passwordpasswordpasswordpassword").unwrap_err().to_string();
        assert!(err.contains("VQ_TOKEN_SECRET has only 7 distinct") && !err.contains("password"), "{err}");
        assert!(from(b"0123456789abcdef0123456789abcdef").is_ok());
        let err = Secret::from_source(vec![b'x'; 40], "the file /run/s").unwrap_err().to_string();
        assert!(err.starts_with("the file /run/s has only 1"), "{err}");
    }

    #[test]
    fn previous_key_verifies_but_never_signs() {
        let old = Secret::new(b"old-secret-0123456789abcdefghijkl".to_vec()).unwrap();
        let keys = secret().with_previous(old.clone()).unwrap();
        assert_eq!(format!("{keys:?}"), "Secret(***, previous ***)");
        let by_old = mint(&old, target(), &UserId::from(7), 1000, 300).raw;
        let by_new = mint(&keys, target(), &UserId::from(7), 1000, 300).raw;
        assert_eq!(by_new, mint(&secret(), target(), &UserId::from(7), 1000, 300).raw, "the current key signs");
        assert_eq!(verify_signature_with_key(&keys, &by_old).unwrap().1, KeyUsed::Previous);
        assert_eq!(verify_signature_with_key(&keys, &by_new).unwrap().1, KeyUsed::Current);
        assert!(verify(&keys, &by_old, target(), &UserId::from(7), 1299).is_ok());
        assert_eq!(verify(&keys, &by_old, target(), &UserId::from(7), 1300), Err(TokenError::Expired { at: 1300 }));
        assert_eq!(verify(&secret(), &by_old, target(), &UserId::from(7), 1000), Err(TokenError::BadSignature));
        assert_eq!(secret().with_previous(secret()).unwrap_err(), SecretError::PreviousIsCurrent);
    }
}
