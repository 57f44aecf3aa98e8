//! The sale lifecycle of a target: its schedule, the phase it is in at a given time (the one
//! home of that rule: `SaleRecord::phase`), and the operators' controls. The opening order is
//! in `opening.rs`, the ledger's rows in `ledger.rs`.
//!
//! Pure: times are epoch milliseconds passed in (the stores read Redis' clock).

/// Why a schedule or a time given by an operator is refused; the text is shown as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error(
        "`{0}` is not an ISO-8601 time: expected e.g. 2026-12-24T10:00:00Z or 2026-12-24T11:00:00+01:00 (a UTC offset is required)"
    )]
    BadTime(String),
    #[error("opens-at {opens_at} is in the past (now {now})")]
    OpensInPast { opens_at: String, now: String },
    #[error("prequeue-from {from} is not before opens-at {opens_at}")]
    PrequeueAfterOpening { from: String, opens_at: String },
    #[error("closes-at {closes_at} is not after opens-at {opens_at}")]
    ClosesBeforeOpening { closes_at: String, opens_at: String },
}

/// Parses an ISO-8601 date and time with its UTC offset (the `time` crate's ISO-8601 parser:
/// `2026-12-24T10:00:00Z`, `…+01:00`, `…-0430`, seconds and fractions optional; a space may
/// stand for the `T`, as RFC 3339 allows); returns epoch milliseconds, from 1970 to 9999.
pub fn parse_instant(s: &str) -> Result<u64, ScheduleError> {
    let bad = || ScheduleError::BadTime(s.to_owned());
    let mut text = s.trim().to_ascii_uppercase();
    if text.as_bytes().get(10) == Some(&b' ') {
        text.replace_range(10..11, "T");
    }
    let at = time::OffsetDateTime::parse(&text, &time::format_description::well_known::Iso8601::DEFAULT)
        .map_err(|_| bad())?;
    // (The crate takes offsets up to ±25:59; no zone is beyond ±14:00.)
    if at.year() > 9999 || at.offset().whole_hours().abs() > 23 {
        return Err(bad());
    }
    u64::try_from(at.unix_timestamp_nanos() / 1_000_000).map_err(|_| bad())
}

/// Epoch ms as ISO-8601 UTC: `2026-12-24T10:00:00Z`, with `.mmm` when not a whole second.
pub fn format_instant(epoch_ms: u64) -> String {
    let at = time::OffsetDateTime::UNIX_EPOCH + time::Duration::milliseconds(epoch_ms.min(i64::MAX as u64) as i64);
    let (date, clock) = (at.date(), at.time());
    let frac = match epoch_ms % 1000 {
        0 => String::new(),
        ms => format!(".{ms:03}"),
    };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{frac}Z",
        date.year(),
        u8::from(date.month()),
        date.day(),
        clock.hour(),
        clock.minute(),
        clock.second()
    )
}

/// When a target's sale opens, and optionally when its pre-queue opens and when it closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleSchedule {
    pub opens_at_ms: u64,
    /// Entries from here to the opening are pre-queued; without it they are told SCHEDULED.
    pub prequeue_from_ms: Option<u64>,
    pub closes_at_ms: Option<u64>,
}

impl SaleSchedule {
    /// Checks the times against each other and against `now_ms` (the opening must be ahead).
    pub fn validate(&self, now_ms: u64) -> Result<(), ScheduleError> {
        let opens_at = format_instant(self.opens_at_ms);
        if self.opens_at_ms <= now_ms {
            return Err(ScheduleError::OpensInPast { opens_at, now: format_instant(now_ms) });
        }
        if let Some(from) = self.prequeue_from_ms.filter(|f| *f >= self.opens_at_ms) {
            return Err(ScheduleError::PrequeueAfterOpening { from: format_instant(from), opens_at });
        }
        if let Some(closes) = self.closes_at_ms.filter(|c| *c <= self.opens_at_ms) {
            return Err(ScheduleError::ClosesBeforeOpening { closes_at: format_instant(closes), opens_at });
        }
        Ok(())
    }
}

/// Where a sale is at a given moment by the clock and its record (named in kebab-case, in
/// JSON and in text alike); the one home of the rule is [`SaleRecord::phase`], and the
/// prelude's `sale_phase` numbers these variants in order from 1. A new phase is one variant
/// here and one branch there: every match on it below, in the embedded store and in
/// [`SaleState::of`] is exhaustive, so the compiler names each place that must decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, strum::IntoStaticStr, strum::VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum SalePhase {
    /// Before the pre-queue (or, without one, before the opening): entries are not recorded.
    Scheduled,
    /// Entries are recorded, unordered, until the opening.
    PreQueue,
    /// The opening time has passed and the pre-queue is being given its order: nobody is
    /// admitted until that is done.
    Opening,
    /// As a target without a sale: first come, first served.
    Open,
    Closed,
}

impl SalePhase {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether the phase admits nobody, a pause aside ([`SaleRecord::holds_admission`]).
    pub fn holds_admission(self) -> bool {
        match self {
            SalePhase::Scheduled | SalePhase::PreQueue | SalePhase::Opening | SalePhase::Closed => true,
            SalePhase::Open => false,
        }
    }
}

/// The sale's state as operators see it: its phase, or `Paused` while paused and not closed.
/// `vq sale show`, `vq stats`, the stats endpoint's `saleState` and the `state` label of
/// `/metrics`' `virtual_queue_sale_state` name it (kebab-case); the OpenAPI document and the
/// shipped alert rules are checked against [`SaleState::VARIANTS`] by tests.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::VariantArray,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum SaleState {
    Scheduled,
    PreQueue,
    Opening,
    Open,
    Paused,
    Closed,
}

impl SaleState {
    /// The state of a sale in `phase`, `paused` or not.
    pub fn of(phase: SalePhase, paused: bool) -> Self {
        match (phase, paused) {
            (SalePhase::Closed, _) => SaleState::Closed,
            (SalePhase::Scheduled | SalePhase::PreQueue | SalePhase::Opening | SalePhase::Open, true) => {
                SaleState::Paused
            }
            (SalePhase::Scheduled, false) => SaleState::Scheduled,
            (SalePhase::PreQueue, false) => SaleState::PreQueue,
            (SalePhase::Opening, false) => SaleState::Opening,
            (SalePhase::Open, false) => SaleState::Open,
        }
    }

    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether admitting nobody is what the operator asked for: before the opening, paused,
    /// closed. No rate alert then (`vq stats`' `RATE_UNDER_50`, the shipped rule
    /// VirtualQueueAdmissionSlow). The opening is the pump's work, which a failing pump never
    /// ends: it is not held on purpose.
    pub fn holds_admission_on_purpose(self) -> bool {
        match self {
            SaleState::Scheduled | SaleState::PreQueue | SaleState::Paused | SaleState::Closed => true,
            SaleState::Opening | SaleState::Open => false,
        }
    }
}

impl std::fmt::Display for SaleState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A target's sale as stored (the hash `queue:{T}:sale`; read by `store::redis::codec`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaleRecord {
    pub opens_at_ms: Option<u64>,
    pub prequeue_from_ms: Option<u64>,
    pub closes_at_ms: Option<u64>,
    /// Lowercase hex of the 32-byte seed; shown only from the opening on.
    pub seed: Option<String>,
    /// Lowercase hex SHA-256 of the seed bytes, published from the schedule on.
    pub commitment: Option<String>,
    pub paused: bool,
    /// Closed by a command or the purchase API (a passed `closes_at` closes without it).
    pub closed: bool,
    pub message: Option<String>,
    /// Who closed it.
    pub close_source: Option<SaleSource>,
    /// Users pre-queued when the opening froze the pre-queue.
    pub prequeued: Option<u64>,
    /// The opening order was written (by Redis' clock), epoch ms.
    pub opened_at_ms: Option<u64>,
    /// The last resume after a pause (by Redis' clock), epoch ms: admission restarted then.
    pub resumed_at_ms: Option<u64>,
}

impl SaleRecord {
    /// The phase at `now_ms`; `None` when there is no sale: no opening, no closing time and
    /// not closed. A pause alone is not a sale (`paused` still holds admission: see
    /// [`Self::holds_admission`]). The one home of the rule: the prelude's `sale_phase`
    /// (lua/prelude.lua) is checked against it by tests/it/scripts.rs.
    pub fn phase(&self, now_ms: u64) -> Option<SalePhase> {
        if self.opens_at_ms.is_none() && self.closes_at_ms.is_none() && !self.closed {
            return None;
        }
        Some(self.phase_at(now_ms))
    }

    /// Whether nobody is admitted at `now_ms`: before the opening is done, closed, or paused
    /// (also a pause without a schedule). The prelude's `sale_holds_admission` (admit.lua).
    pub fn holds_admission(&self, now_ms: u64) -> bool {
        self.paused || self.phase(now_ms).is_some_and(SalePhase::holds_admission)
    }

    /// The phase at `now_ms`, [`SalePhase::Open`] when there is no sale (see [`Self::phase`]).
    pub fn phase_at(&self, now_ms: u64) -> SalePhase {
        if self.closed || self.closes_at_ms.is_some_and(|c| now_ms >= c) {
            return SalePhase::Closed;
        }
        // Once the opening order is written the sale is open, whatever the clock says.
        let Some(opens) = self.opens_at_ms.filter(|o| *o > 0 && self.opened_at_ms.is_none()) else {
            return SalePhase::Open;
        };
        if now_ms < self.prequeue_from_ms.unwrap_or(opens) {
            SalePhase::Scheduled
        } else if now_ms < opens {
            SalePhase::PreQueue
        } else {
            SalePhase::Opening
        }
    }

    /// The state operators see: the phase, or paused while paused and not closed.
    pub fn state_at(&self, now_ms: u64) -> SaleState {
        SaleState::of(self.phase_at(now_ms), self.paused)
    }

    /// The seed, once the opening has revealed it.
    pub fn revealed_seed(&self) -> Option<&str> {
        self.opened_at_ms.and(self.seed.as_deref())
    }
}

/// Who changed the sale's state (written as the variant in kebab-case: in the ledger, the
/// sale's hash, the events and the reports).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::VariantArray,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum SaleSource {
    /// An operator (`vq sale`).
    Command,
    /// The schedule's `closes_at` passed.
    Schedule,
    /// The purchase API said sold out.
    PurchaseApi,
}

impl SaleSource {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl std::fmt::Display for SaleSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One operator (or purchase API) change of a sale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaleControl {
    Pause,
    Resume,
    Close {
        message: String,
        source: SaleSource,
    },
    /// Back to the always-open behaviour: the schedule, seed and pre-queue go; the ledger stays.
    Clear,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_utc_and_offsets() {
        assert_eq!(parse_instant("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_instant("2026-12-24T10:00:00Z"), Ok(1_798_106_400_000));
        assert_eq!(parse_instant("2026-12-24T11:00:00+01:00"), Ok(1_798_106_400_000));
        assert_eq!(parse_instant("2026-12-24T05:30:00-0430"), Ok(1_798_106_400_000));
        assert_eq!(parse_instant("2026-12-24 10:00Z"), Ok(1_798_106_400_000));
        assert_eq!(parse_instant("2026-12-24T10:00:00.25Z"), Ok(1_798_106_400_250));
        assert_eq!(parse_instant("2026-12-24t10:00:00,25z"), Ok(1_798_106_400_250));
        assert_eq!(parse_instant(" 2026-12-24T10:00:00.2509Z "), Ok(1_798_106_400_250));
        assert_eq!(parse_instant("2000-02-29T00:00:00Z"), Ok(951_782_400_000));
    }

    #[test]
    fn refuses_what_is_not_an_instant() {
        for bad in [
            "",
            "tomorrow",
            "2026-12-24",
            "2026-12-24T10:00:00",
            "2026-13-01T00:00:00Z",
            "2026-02-29T00:00:00Z",
            "2026-12-24T24:00:00Z",
            "2026-12-24T10:00:00+25:00",
            "2026-12-24T10:00:00Zjunk",
            "2026-12-24T10:00:00.Z",
            "1969-12-31T23:59:59Z",
        ] {
            assert!(matches!(parse_instant(bad), Err(ScheduleError::BadTime(_))), "{bad:?}");
        }
    }

    #[test]
    fn formats_back() {
        assert_eq!(format_instant(1_798_106_400_000), "2026-12-24T10:00:00Z");
        assert_eq!(format_instant(1_798_106_400_250), "2026-12-24T10:00:00.250Z");
        assert_eq!(format_instant(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_instant(951_782_400_000), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn schedule_checks_its_order() {
        let s = |o, p, c| SaleSchedule { opens_at_ms: o, prequeue_from_ms: p, closes_at_ms: c };
        assert!(s(2000, Some(1500), Some(3000)).validate(1000).is_ok());
        assert!(matches!(s(900, None, None).validate(1000), Err(ScheduleError::OpensInPast { .. })));
        assert!(matches!(s(2000, Some(2000), None).validate(1000), Err(ScheduleError::PrequeueAfterOpening { .. })));
        assert!(matches!(s(2000, None, Some(2000)).validate(1000), Err(ScheduleError::ClosesBeforeOpening { .. })));
    }

    #[test]
    fn phases_follow_the_clock() {
        let r = SaleRecord {
            opens_at_ms: Some(2000),
            prequeue_from_ms: Some(1000),
            closes_at_ms: Some(5000),
            ..SaleRecord::default()
        };
        assert_eq!(r.phase_at(999), SalePhase::Scheduled);
        assert_eq!(r.phase_at(1000), SalePhase::PreQueue);
        assert_eq!(r.phase_at(2000), SalePhase::Opening);
        let opened = SaleRecord { opened_at_ms: Some(2001), ..r.clone() };
        assert_eq!(opened.phase_at(2001), SalePhase::Open);
        assert_eq!(opened.phase_at(5000), SalePhase::Closed);
        let no_prequeue = SaleRecord { prequeue_from_ms: None, ..r };
        assert_eq!(no_prequeue.phase_at(1999), SalePhase::Scheduled);
        let paused = SaleRecord { paused: true, ..opened };
        assert_eq!(paused.state_at(3000), SaleState::Paused);
        assert_eq!(paused.state_at(6000), SaleState::Closed);
        assert!(paused.holds_admission(3000));
        let pause_alone = SaleRecord { paused: true, ..SaleRecord::default() };
        assert_eq!(pause_alone.phase(0), None, "a pause alone is no sale");
        assert!(pause_alone.holds_admission(0), "but it holds admission");
    }

    #[test]
    fn every_state_is_named_and_parsed_back_and_every_phase_has_its_state() {
        use strum::VariantArray;
        for state in SaleState::VARIANTS {
            assert_eq!(state.as_str().parse::<SaleState>(), Ok(*state));
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
        assert!("soft-closed".parse::<SaleState>().is_err(), "an unknown name is no state");
        for phase in SalePhase::VARIANTS {
            assert_eq!(SaleState::of(*phase, false).as_str(), phase.as_str(), "a phase unpaused is its own state");
        }
        for source in SaleSource::VARIANTS {
            assert_eq!(source.as_str().parse::<SaleSource>(), Ok(*source));
            assert_eq!(serde_json::to_value(source).unwrap(), source.as_str());
        }
    }
}
