//! How the domain's records are stored in Redis, both ways: the ledger's rows, the sale's hash,
//! the adaptive outflow's decision and the record's hash. The domain keeps the typed values
//! ([`LedgerEntry`], [`SaleRecord`], [`OutflowState`], [`TargetRecord`]); the Lua scripts
//! write these forms (the prelude's `ledger_row`), this file is the one place that reads them.

use std::collections::{BTreeMap, HashMap};

use crate::domain::{AnswerClass, EventKind, LedgerEntry, PurchaseRefusal, SaleRecord, TargetRecord};
use crate::store::OutflowState;

/// Parses a ledger row: `admit|ms|before|after|admitted|instance`, `open|ms|n|commitment|seed`,
/// `pause|ms|source`, `resume|ms|source`, `close|ms|source|message`, `clear|ms|source`,
/// `schedule|ms|opens_at|prequeue_from|closes_at` (empty for none),
/// `batch|ms|from|to|instance|reason` (from empty at the first decision). A source is a
/// [`crate::domain::SaleSource`] by its name; `None` for a row of another form (an unknown
/// kind or source, a number that is none), which readers leave out.
pub(super) fn decode_ledger_row(row: &str) -> Option<LedgerEntry> {
    let mut p = row.splitn(6, '|');
    let kind = p.next()?;
    let at_ms = p.next()?.parse().ok()?;
    let mut next = || p.next().map(str::to_owned);
    Some(match kind {
        "admit" => LedgerEntry::Admission {
            at_ms,
            mark_before: next()?.parse().ok()?,
            mark_after: next()?.parse().ok()?,
            admitted: next()?.parse().ok()?,
            instance: next().unwrap_or_default(),
        },
        "open" => LedgerEntry::Opening {
            at_ms,
            prequeued: next()?.parse().ok()?,
            seed_commitment: next()?,
            seed: next().unwrap_or_default(),
        },
        "pause" => LedgerEntry::Pause { at_ms, source: next()?.parse().ok()? },
        "resume" => LedgerEntry::Resume { at_ms, source: next()?.parse().ok()? },
        "close" => {
            let source = next()?.parse().ok()?;
            // The message may hold '|': it is the rest of the row.
            let rest: Vec<String> = std::iter::from_fn(&mut next).collect();
            LedgerEntry::Close { at_ms, source, message: rest.join("|") }
        }
        "clear" => LedgerEntry::Clear { at_ms, source: next()?.parse().ok()? },
        "schedule" => {
            let opens_at_ms = next()?.parse().ok()?;
            let mut opt = || next().and_then(|v| v.parse().ok());
            LedgerEntry::Schedule { at_ms, opens_at_ms, prequeue_from_ms: opt(), closes_at_ms: opt() }
        }
        "batch" => LedgerEntry::Batch {
            at_ms,
            from: next()?.parse().ok(),
            to: next()?.parse().ok()?,
            instance: next()?,
            // The reason is the rest of the row.
            reason: next().unwrap_or_default(),
        },
        _ => return None,
    })
}

/// An event log's entry (its field `row`): a ledger row of the sale or the outflow
/// ([`decode_ledger_row`]), or a kind only the logs hold: `prequeue|ms|opens_at|prequeue_from`,
/// `admitted|ms|total|first` or `|every`, `emptied|ms|mark` (written by the scripts), and
/// `degraded|ms|answer|count|instance`, `drift|ms|offset_ms|off|instance`
/// ([`encode_instance_event`]). The time, and the event.
pub(super) fn decode_event_row(row: &str) -> Option<(u64, EventKind)> {
    if let Some(entry) = decode_ledger_row(row) {
        return EventKind::of_ledger(&entry).map(|k| (entry.at_ms(), k));
    }
    let mut p = row.splitn(5, '|');
    let kind = p.next()?;
    let at_ms = p.next()?.parse().ok()?;
    let mut num = || p.next().and_then(|v| v.parse::<u64>().ok());
    let event = match kind {
        "prequeue" => EventKind::PrequeueOpened { opens_at_ms: num()?, prequeue_from_ms: num() },
        "admitted" => {
            let admitted = num()?;
            match p.next()? {
                "first" => EventKind::FirstAdmission { admitted },
                _ => EventKind::AdmissionMilestone { admitted },
            }
        }
        "emptied" => EventKind::QueueEmptied { mark: num()? },
        "degraded" => {
            let answer = p.next()?.to_owned();
            let count = p.next()?.parse().ok()?;
            EventKind::Degraded { instance: p.next().unwrap_or_default().to_owned(), answer, count }
        }
        "drift" => {
            let offset_ms = p.next()?.parse().ok()?;
            let off = p.next()? == "1";
            EventKind::ClockDrift { instance: p.next().unwrap_or_default().to_owned(), offset_ms, off }
        }
        _ => return None,
    };
    Some((at_ms, event))
}

/// The stored row of an instance's event ([`EventKind::Degraded`], [`EventKind::ClockDrift`]); `None` for
/// the kinds only a target's scripts write.
pub(super) fn encode_instance_event(at_ms: u64, kind: &EventKind) -> Option<String> {
    match kind {
        EventKind::Degraded { instance, answer, count } => {
            Some(format!("degraded|{at_ms}|{answer}|{count}|{instance}"))
        }
        EventKind::ClockDrift { instance, offset_ms, off } => {
            Some(format!("drift|{at_ms}|{offset_ms}|{}|{instance}", u8::from(*off)))
        }
        _ => None,
    }
}

/// The stored row of a batch change (the only kind vq writes outside Lua).
pub(super) fn encode_batch_row(at_ms: u64, from: Option<u64>, to: u64, instance: &str, reason: &str) -> String {
    let from = from.map(|f| f.to_string()).unwrap_or_default();
    format!("batch|{at_ms}|{from}|{to}|{}|{reason}", instance.replace('|', "/"))
}

/// The fields of the sale's hash (`queue:{T}:sale`) the scripts decide by: the prelude's
/// `sale_read` reads these (`SALE_FIELDS` in `lua/prelude.lua`, the same list, checked by the
/// tests of `scripts.rs` and on a real Redis by `tests/it/scripts.rs`) into a table by name, and
/// [`decode_sale`] reads each of them. A new field of the sale is added here and there.
pub const SALE_FIELDS: [&str; 8] =
    ["opens_at", "prequeue_from", "closes_at", "paused", "closed", "message", "frozen", "opened_at"];

/// The sale's hash (`queue:{T}:sale`) as the scripts write it; `None` when it is empty.
pub(super) fn decode_sale(fields: &HashMap<String, String>) -> Option<SaleRecord> {
    if fields.is_empty() {
        return None;
    }
    let num = |k: &str| fields.get(k).and_then(|v| v.parse::<u64>().ok());
    let text = |k: &str| fields.get(k).filter(|v| !v.is_empty()).cloned();
    Some(SaleRecord {
        opens_at_ms: num("opens_at"),
        prequeue_from_ms: num("prequeue_from"),
        closes_at_ms: num("closes_at"),
        seed: text("seed"),
        commitment: text("commitment"),
        paused: fields.get("paused").is_some_and(|v| v == "1"),
        closed: fields.get("closed").is_some_and(|v| v == "1"),
        message: text("message"),
        close_source: fields.get("close_source").and_then(|v| v.parse().ok()),
        prequeued: num("frozen"),
        opened_at_ms: num("opened_at"),
        resumed_at_ms: num("resumed_at"),
    })
}

/// The adaptive outflow's decision (`queue:{T}:outflow`) as `outflow_set.lua` writes it: field
/// and value pairs (an absent figure an empty value).
pub(super) fn encode_outflow(s: &OutflowState) -> [(&'static str, String); 9] {
    let opt = |v: Option<u64>| v.map(|n| n.to_string()).unwrap_or_default();
    [
        ("batch", s.batch.to_string()),
        ("reason", s.reason.clone()),
        ("at", s.decided_at_ms.to_string()),
        ("used", s.tokens_used.to_string()),
        ("expired", s.tokens_expired.to_string()),
        ("no_show", opt(s.no_show_bp)),
        ("purchases", s.purchases.to_string()),
        ("p95", opt(s.p95_ms)),
        ("error_bp", s.error_bp.to_string()),
    ]
}

/// The adaptive outflow's decision from its hash; `None` before the first one.
pub(super) fn decode_outflow(fields: &HashMap<String, String>) -> Option<OutflowState> {
    let num = |k: &str| fields.get(k).and_then(|v| v.parse::<u64>().ok());
    Some(OutflowState {
        batch: num("batch")?,
        reason: fields.get("reason").cloned().unwrap_or_default(),
        decided_at_ms: num("at").unwrap_or(0),
        no_show_bp: num("no_show"),
        tokens_used: num("used").unwrap_or(0),
        tokens_expired: num("expired").unwrap_or(0),
        purchases: num("purchases").unwrap_or(0),
        p95_ms: num("p95"),
        error_bp: num("error_bp").unwrap_or(0),
    })
}

/// The record's field counting purchases forwarded in `tick` that got `answer` (`p:<tick>:<name>`).
pub(super) fn purchase_field(tick: u64, answer: AnswerClass) -> String {
    format!("p:{tick}:{}", answer.name())
}

/// The record's field counting purchases refused for `why` (`rf:<name>`).
pub(super) fn refusal_field(why: PurchaseRefusal) -> String {
    format!("rf:{}", why.name())
}

/// The record (`queue:{T}:record`) from its hash fields (listed in `domain::record`'s module
/// doc); fields it does not know are ignored.
pub(super) fn decode_record<'a>(fields: impl IntoIterator<Item = (&'a str, &'a str)>) -> TargetRecord {
    let mut r = TargetRecord::default();
    let mut events = BTreeMap::new();
    for (field, value) in fields {
        let n = || value.parse::<u64>().ok();
        let (head, tail) = field.split_once(':').unwrap_or((field, ""));
        let tick = || tail.parse::<u64>().ok();
        match head {
            "a" => add(&mut r.arrivals, tick(), n()),
            "t" => add(&mut r.admissions, tick(), n()),
            "p" => {
                let Some((tick, class)) = tail.split_once(':') else { continue };
                let (Ok(tick), Some(c), Some(n)) =
                    (tick.parse::<u64>(), AnswerClass::ALL.iter().position(|c| c.name() == class), n())
                else {
                    continue;
                };
                r.purchases.entry(tick).or_default().0[c] += n;
            }
            "wb" => {
                if let (Some(b), Some(n)) = (tick(), n()) {
                    *r.waits.buckets.entry(b).or_default() += n;
                }
            }
            "e" => {
                if let (Some(i), Some(e)) = (tick(), decode_ledger_row(value)) {
                    events.insert(i, e);
                }
            }
            "wc" => r.waits.count = n().unwrap_or(0),
            "ws" => r.waits.sum_ms = n().unwrap_or(0),
            "wmax" => r.wait_max_ms = n(),
            "admitted" => r.admitted = n().unwrap_or(0),
            "left" => r.left = n().unwrap_or(0),
            "evicted" => r.evicted = n().unwrap_or(0),
            "ti" => r.tokens_issued = n().unwrap_or(0),
            "ti_last" => r.last_issue_ms = n(),
            "tu" => r.tokens_used = n().unwrap_or(0),
            "tud" => r.direct_tokens_used = n().unwrap_or(0),
            "rf" => {
                if let (Some(why), Some(n)) = (PurchaseRefusal::of_name(tail), n()) {
                    r.refused.add(why, n);
                }
            }
            "tick_ms" => r.tick_ms = n().filter(|t| *t > 0),
            _ => {}
        }
    }
    r.events = events.into_values().collect();
    r
}

fn add(map: &mut BTreeMap<u64, u64>, tick: Option<u64>, n: Option<u64>) {
    if let (Some(tick), Some(n)) = (tick, n) {
        *map.entry(tick).or_default() += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{SaleReport, SaleSource, format_instant};

    #[test]
    fn ledger_rows_round_trip() {
        assert_eq!(
            decode_ledger_row("admit|5|0|10|10|host-1:99"),
            Some(LedgerEntry::Admission {
                at_ms: 5,
                mark_before: 0,
                mark_after: 10,
                admitted: 10,
                instance: "host-1:99".into()
            })
        );
        assert_eq!(
            decode_ledger_row("close|7|purchase-api|Sold | out"),
            Some(LedgerEntry::Close { at_ms: 7, source: SaleSource::PurchaseApi, message: "Sold | out".into() })
        );
        assert_eq!(
            decode_ledger_row("pause|7|command"),
            Some(LedgerEntry::Pause { at_ms: 7, source: SaleSource::Command })
        );
        assert_eq!(decode_ledger_row("pause|7|operator"), None, "an unknown source is no row");
        assert_eq!(decode_ledger_row("nonsense"), None);
        let row = encode_batch_row(9, None, 20, "host-1:7", "target: 10 / (1 − 0.50) | more");
        assert_eq!(
            decode_ledger_row(&row),
            Some(LedgerEntry::Batch {
                at_ms: 9,
                from: None,
                to: 20,
                instance: "host-1:7".into(),
                reason: "target: 10 / (1 − 0.50) | more".into()
            })
        );
        let row = encode_batch_row(9, Some(20), 14, "h", "down: x");
        assert!(matches!(decode_ledger_row(&row), Some(LedgerEntry::Batch { from: Some(20), to: 14, .. })));
    }

    #[test]
    fn an_outflow_decision_round_trips() {
        let s = OutflowState {
            batch: 40,
            reason: "down: errors 0.30 > 0.05".into(),
            decided_at_ms: 9,
            no_show_bp: None,
            tokens_used: 3,
            tokens_expired: 1,
            purchases: 20,
            p95_ms: Some(250),
            error_bp: 3000,
        };
        let fields: HashMap<String, String> = encode_outflow(&s).into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        assert_eq!(decode_outflow(&fields), Some(s));
        assert_eq!(decode_outflow(&HashMap::new()), None);
    }

    #[test]
    fn sale_hash_becomes_the_record() {
        assert_eq!(decode_sale(&HashMap::new()), None);
        let fields: HashMap<String, String> = [("opens_at", "2000"), ("paused", "1"), ("frozen", "3"), ("message", "")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let r = decode_sale(&fields).unwrap();
        assert_eq!((r.opens_at_ms, r.paused, r.prequeued, r.message), (Some(2000), true, Some(3), None));
    }

    /// Each field the scripts read is one the record takes: set alone to "1", it shows.
    #[test]
    fn every_sale_field_the_scripts_read_is_decoded() {
        let empty = decode_sale(&HashMap::from([("close_source".to_owned(), "?".to_owned())])).unwrap();
        for field in SALE_FIELDS {
            let r = decode_sale(&HashMap::from([(field.to_owned(), "1".to_owned())])).unwrap();
            assert_ne!(r, empty, "{field} is not read by decode_sale");
        }
    }

    #[test]
    fn fields_become_the_record_and_the_report_adds_them_up() {
        let fields = [
            ("a:10", "5"),
            ("a:11", "2"),
            ("t:11", "4"),
            ("p:12:2xx", "3"),
            ("p:12:5xx", "1"),
            ("p:12:bogus", "9"),
            ("wb:3", "4"),
            ("wc", "4"),
            ("ws", "14000"),
            ("wmax", "3900"),
            ("admitted", "4"),
            ("left", "1"),
            ("evicted", "2"),
            ("ti", "4"),
            ("ti_last", "1000"),
            ("tu", "3"),
            ("tick_ms", "1000"),
            ("e:2", "pause|12000|command"),
            ("e:1", "open|11000|7|c0ffee|5eed"),
            ("events", "2"),
        ];
        let r = decode_record(fields);
        assert_eq!(r.events.len(), 2);
        assert!(matches!(r.events[0], LedgerEntry::Opening { prequeued: 7, .. }), "oldest first");
        let report = SaleReport::build("LIMITED_DROP:1", &r, 100_000, 2000, 60_000);
        assert_eq!(report.tick_ms, 1000, "the record's own tick");
        assert_eq!(report.totals.arrivals, 7);
        assert_eq!(report.totals.purchases_forwarded, 4);
        assert_eq!(report.totals.answers.get(AnswerClass::ServerError), 1);
        assert_eq!(report.series.len(), 3);
        assert_eq!((report.series[2].tick, report.series[2].forwarded), (12, 4));
        assert_eq!(report.series[0].at, format_instant(10_000));
        assert_eq!(report.tokens.expired, Some(1), "the last token expired at 61 s");
        assert!((report.waits.avg_seconds - 3.5).abs() < 1e-9);
        assert!((3.0..=4.0).contains(&report.waits.p50_seconds));
        assert!((report.waits.max_seconds - 3.9).abs() < 1e-9);
        // The buckets say 3-4 s; the longest wait measured was 3.9 s, and no quantile passes it.
        assert!(report.waits.p95_seconds <= report.waits.max_seconds, "{:?}", report.waits);
        assert_eq!(report.opening.map(|o| o.seed), Some("5eed".to_owned()));
    }
}
