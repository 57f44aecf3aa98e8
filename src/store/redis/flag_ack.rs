//! How an instance's flag acknowledgement is stored in Redis (`flag_ack.lua` writes it, and
//! `flag_acks.lua` lists it): the hash value `version:applied_at_ms:expires_at_ms:missing:state`
//! (the prelude's `ack_value`), which `flag_acks.lua` answers without the expiry and with how
//! long the instance has been silent.

use crate::store::FlagAck;

impl FlagAck {
    /// The hash value after the version and time: `missing:state`.
    pub(super) fn encode_rest(&self) -> (&'static str, String) {
        (if self.kept_missing { "1" } else { "0" }, self.clone().stored().state)
    }

    /// Parses `version:applied_at_ms[:missing:state]`.
    pub(super) fn decode(instance: &str, value: &str, silent_ms: Option<u64>) -> Option<Self> {
        let mut parts = value.splitn(4, ':');
        let version = parts.next()?.parse().ok()?;
        let applied_at_ms = parts.next()?.parse().ok()?;
        let kept_missing = parts.next() == Some("1");
        let state = parts.next().unwrap_or_default().to_owned();
        Some(Self { instance: instance.to_owned(), version, applied_at_ms, kept_missing, state, silent_ms })
    }
}
