//! The forms of `vq sale report`: a text summary, CSV (the per-tick series in rows) and one
//! self-contained HTML file (inline CSS, inline SVG charts drawn here; nothing fetched). All
//! three are made from the [`SaleReport`] that `--json` prints.

use std::fmt::Write as _;

use crate::domain::{AnswerClass, LedgerEntry, PurchaseRefusal, Refusals, SaleReport, format_instant};

/// The CSV: one row per tick with anything counted.
pub fn csv(r: &SaleReport) -> String {
    let mut out = String::from("tick,at,arrivals,admitted,forwarded");
    for c in AnswerClass::ALL {
        let _ = write!(out, ",answers_{}", c.name());
    }
    out.push('\n');
    for row in &r.series {
        let _ = write!(out, "{},{},{},{},{}", row.tick, row.at, row.arrivals, row.admitted, row.forwarded);
        for c in AnswerClass::ALL {
            let _ = write!(out, ",{}", row.answers.get(c));
        }
        out.push('\n');
    }
    out
}

/// The text summary printed without a format flag.
pub fn text(r: &SaleReport) -> String {
    let t = &r.totals;
    let w = &r.waits;
    let k = &r.tokens;
    let mut out = String::new();
    let _ = writeln!(out, "{} sale report (generated {})", r.target, r.generated_at);
    if let (Some(a), Some(b)) = (&r.first_at, &r.last_at) {
        let _ = writeln!(out, "  activity: {a} .. {b} (ticks of {} ms)", r.tick_ms);
    }
    let _ =
        writeln!(out, "  arrivals: {}; admitted: {}; left: {}; evicted: {}", t.arrivals, t.admitted, t.left, t.evicted);
    let _ = writeln!(
        out,
        "  waits ({} measured): avg {:.1} s, p50 {:.1} s, p95 {:.1} s, max {:.1} s",
        w.counted, w.avg_seconds, w.p50_seconds, w.p95_seconds, w.max_seconds
    );
    let expired = k
        .expired
        .map_or_else(|| "expired: known once every token's life is over".to_owned(), |n| format!("{n} expired"));
    let _ = writeln!(
        out,
        "  tokens: {} issued, {} used, {expired}; {} purchases with stateless tokens",
        k.issued, k.used, k.direct_used
    );
    let answers: Vec<String> = AnswerClass::ALL.iter().map(|c| format!("{} {}", t.answers.get(*c), c.name())).collect();
    let _ = writeln!(out, "  purchases forwarded: {} ({})", t.purchases_forwarded, answers.join(", "));
    let _ = writeln!(out, "  purchases refused: {}", refused_text(&t.refused));
    for l in &r.lanes {
        let _ = writeln!(
            out,
            "  lane {}: arrivals {}, admitted {} (first at {}), left {}, evicted {}, avg wait {:.1} s",
            l.lane,
            l.arrivals,
            l.admitted,
            l.first_admitted_at.as_deref().unwrap_or("-"),
            l.left,
            l.evicted,
            l.avg_wait_seconds
        );
    }
    if let Some(o) = &r.opening {
        let _ = writeln!(
            out,
            "  opening: {} with {} pre-queued; seed {} (commitment {})",
            o.at, o.prequeued, o.seed, o.seed_commitment
        );
    }
    for e in &r.events {
        let _ = writeln!(out, "  {}  {}", format_instant(e.at_ms()), event_text(e));
    }
    let _ = writeln!(out, "  (--json for everything, --csv for the series per tick, --html FILE for charts)");
    out
}

/// Purchases the gate refused, with each reason's count: "3 (token_used 2, user_limit 1,
/// no_valid_token 0)".
fn refused_text(n: &Refusals) -> String {
    let each: Vec<String> = PurchaseRefusal::ALL.iter().map(|r| format!("{} {}", r.name(), n.get(*r))).collect();
    format!("{} ({})", n.total(), each.join(", "))
}

/// An event in words, with who ran it.
fn event_text(e: &LedgerEntry) -> String {
    let show = |v: &Option<u64>| v.map_or_else(|| "none".to_owned(), format_instant);
    match e {
        LedgerEntry::Admission { admitted, instance, .. } => format!("admitted {admitted} (by {instance})"),
        LedgerEntry::Opening { prequeued, .. } => format!("opening: {prequeued} pre-queued placed (by the pump)"),
        LedgerEntry::Pause { source, .. } => format!("paused (by {source})"),
        LedgerEntry::Resume { source, .. } => format!("resumed (by {source})"),
        LedgerEntry::Close { source, message, .. } => format!("closed: {message} (by {source})"),
        LedgerEntry::Clear { source, .. } => format!("cleared (by {source})"),
        LedgerEntry::Schedule { opens_at_ms, prequeue_from_ms, closes_at_ms, .. } => format!(
            "scheduled: opens {}, pre-queue from {}, closes {} (by command)",
            format_instant(*opens_at_ms),
            show(prequeue_from_ms),
            show(closes_at_ms)
        ),
        LedgerEntry::Batch { from, to, reason, instance, .. } => {
            let from = from.map_or_else(|| "-".to_owned(), |f| f.to_string());
            format!("batch {from} → {to}: {reason} (by {instance})")
        }
    }
}

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Colours of the purchase API's answers, in [`AnswerClass::ALL`] order.
const ANSWER_COLOURS: [&str; 5] = ["#2e7d32", "#1565c0", "#ef6c00", "#c62828", "#616161"];

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 180.0;
const LEFT: f64 = 48.0;
const BOTTOM: f64 = 22.0;

/// One bar of a chart: where on the x axis (0..span), its stacked parts (value, colour), and
/// the name written under it when the chart names its bars.
struct Bar {
    x: u64,
    label: String,
    parts: Vec<(u64, &'static str)>,
}

/// Bars at most, for a chart to write each one's name under it.
const NAMED_BARS: usize = 40;

/// An SVG bar chart: `id`, the x axis spanning `span` slots, labels at its two ends (none: each
/// bar's name under it). Each part is a `<rect class="bar" data-x data-value>`, so what is
/// drawn can be read back.
fn bar_chart(id: &str, bars: &[Bar], span: u64, ends: (&str, &str), unit: &str) -> String {
    let max = bars.iter().map(|b| b.parts.iter().map(|p| p.0).sum::<u64>()).max().unwrap_or(0).max(1);
    let plot_w = WIDTH - LEFT - 8.0;
    let plot_h = HEIGHT - BOTTOM - 8.0;
    let slot = plot_w / span.max(1) as f64;
    let bar_w = (slot * 0.8).clamp(1.0, 40.0);
    let mut svg = format!(
        "<svg id=\"{id}\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\">"
    );
    let base = 8.0 + plot_h;
    let _ = write!(
        svg,
        "<line x1=\"{LEFT}\" y1=\"{base}\" x2=\"{}\" y2=\"{base}\" class=\"axis\"/>\
         <line x1=\"{LEFT}\" y1=\"8\" x2=\"{LEFT}\" y2=\"{base}\" class=\"axis\"/>\
         <text x=\"{}\" y=\"16\" text-anchor=\"end\">{max}</text>\
         <text x=\"{}\" y=\"{base}\" text-anchor=\"end\">0</text>\
         <text x=\"{LEFT}\" y=\"{}\">{}</text>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
        WIDTH - 8.0,
        LEFT - 4.0,
        LEFT - 4.0,
        HEIGHT - 6.0,
        esc(ends.0),
        WIDTH - 8.0,
        HEIGHT - 6.0,
        esc(ends.1),
    );
    for b in bars {
        let x = LEFT + b.x as f64 * slot + (slot - bar_w) / 2.0;
        if ends.0.is_empty() && bars.len() <= NAMED_BARS {
            let _ = write!(
                svg,
                "<text x=\"{:.2}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                x + bar_w / 2.0,
                base + 13.0,
                esc(&b.label)
            );
        }
        let mut top = base;
        for (value, colour) in &b.parts {
            if *value == 0 {
                continue;
            }
            let h = (*value as f64 / max as f64 * plot_h).max(1.0);
            top -= h;
            let _ = write!(
                svg,
                "<rect class=\"bar\" x=\"{x:.2}\" y=\"{top:.2}\" width=\"{bar_w:.2}\" height=\"{h:.2}\" fill=\"{colour}\" \
                 data-x=\"{}\" data-value=\"{value}\"><title>{}: {value} {unit}</title></rect>",
                b.x,
                esc(&b.label)
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

/// The self-contained HTML report.
pub fn html(r: &SaleReport) -> String {
    let first = r.series.first().map_or(0, |s| s.tick);
    let span = r.series.last().map_or(1, |s| s.tick - first + 1);
    let ends = (r.first_at.as_deref().unwrap_or(""), r.last_at.as_deref().unwrap_or(""));
    let per_tick = |id: &str, value: &dyn Fn(&crate::domain::TickRow) -> u64, colour: &'static str, unit: &str| {
        let bars: Vec<Bar> = r
            .series
            .iter()
            .filter(|s| value(s) > 0)
            .map(|s| Bar { x: s.tick - first, label: s.at.clone(), parts: vec![(value(s), colour)] })
            .collect();
        bar_chart(id, &bars, span, ends, unit)
    };
    let arrivals = per_tick("chart-arrivals", &|s| s.arrivals, "#6a1b9a", "arrivals");
    let admitted = per_tick("chart-admitted", &|s| s.admitted, "#00838f", "admitted");
    let purchase_bars: Vec<Bar> = r
        .series
        .iter()
        .filter(|s| s.forwarded > 0)
        .map(|s| Bar {
            x: s.tick - first,
            label: s.at.clone(),
            parts: AnswerClass::ALL.iter().zip(ANSWER_COLOURS).map(|(c, colour)| (s.answers.get(*c), colour)).collect(),
        })
        .collect();
    let purchases = bar_chart("chart-purchases", &purchase_bars, span, ends, "purchases");
    // Waits: one slot per histogram bucket, in order.
    let wait_bars: Vec<Bar> = r
        .waits
        .histogram
        .iter()
        .enumerate()
        .map(|(i, b)| Bar { x: i as u64, label: format!("{} s", b.from_seconds), parts: vec![(b.users, "#37474f")] })
        .collect();
    // No labels at the ends: each bucket is named under its bar (in its tooltip past 40 bars).
    let waits = bar_chart("chart-waits", &wait_bars, wait_bars.len() as u64, ("", ""), "users");
    let legend: String = AnswerClass::ALL
        .iter()
        .zip(ANSWER_COLOURS)
        .map(|(c, colour)| format!("<span><i style=\"background:{colour}\"></i>{}</span>", c.name()))
        .collect();
    let t = &r.totals;
    let w = &r.waits;
    let k = &r.tokens;
    let mut rows = String::new();
    let mut row = |name: &str, value: String| {
        let _ = write!(rows, "<tr><th>{}</th><td>{}</td></tr>", esc(name), esc(&value));
    };
    row("activity", format!("{} .. {}", ends.0, ends.1));
    row("tick", format!("{} ms", r.tick_ms));
    row("arrivals", t.arrivals.to_string());
    row("admitted", t.admitted.to_string());
    row("left (abandoned)", t.left.to_string());
    row("evicted (stopped polling)", t.evicted.to_string());
    row(
        "waits",
        format!(
            "{} measured: avg {:.1} s, p50 {:.1} s, p95 {:.1} s, max {:.1} s",
            w.counted, w.avg_seconds, w.p50_seconds, w.p95_seconds, w.max_seconds
        ),
    );
    row("tokens issued", k.issued.to_string());
    row("tokens used", k.used.to_string());
    row("tokens expired", k.expired.map_or_else(|| format!("{} not used yet", k.unused), |n| n.to_string()));
    row("purchases with stateless tokens", k.direct_used.to_string());
    let answers: Vec<String> = AnswerClass::ALL.iter().map(|c| format!("{} {}", t.answers.get(*c), c.name())).collect();
    row("purchases forwarded", format!("{} ({})", t.purchases_forwarded, answers.join(", ")));
    row("purchases refused", refused_text(&t.refused));
    if let Some(o) = &r.opening {
        row("opening", format!("{} with {} pre-queued", o.at, o.prequeued));
        row("seed", o.seed.clone());
        row("seed commitment (SHA-256 of the seed)", o.seed_commitment.clone());
    }
    let events: String = r
        .events
        .iter()
        .map(|e| format!("<tr><td>{}</td><td>{}</td></tr>", format_instant(e.at_ms()), esc(&event_text(e))))
        .collect();
    let events = if events.is_empty() {
        "<tr><td colspan=\"2\">none: no schedule, pause or close recorded</td></tr>".to_owned()
    } else {
        events
    };
    let target = esc(&r.target);
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{target} sale report</title>\
         <style>body{{font:14px system-ui,sans-serif;margin:24px;color:#212121}}h1{{font-size:20px}}\
         h2{{font-size:16px;margin-top:28px}}table{{border-collapse:collapse}}th,td{{text-align:left;\
         padding:3px 10px;border-bottom:1px solid #e0e0e0;vertical-align:top}}th{{font-weight:600}}\
         .chart text{{font-size:11px;fill:#616161}}.axis{{stroke:#9e9e9e}}.legend span{{margin-right:14px}}\
         .legend i{{display:inline-block;width:10px;height:10px;margin-right:4px}}code{{word-break:break-all}}\
         </style></head><body>\
         <h1>{target}: sale report</h1><p>Generated {generated} from the target's record.</p>\
         <table id=\"summary\">{rows}</table>\
         <h2>Arrivals per tick</h2>{arrivals}\
         <h2>Admitted per tick</h2>{admitted}\
         <h2>Purchases forwarded per tick, by the purchase API's answer</h2><p class=\"legend\">{legend}</p>{purchases}\
         <h2>Waits from entry to admission (users per bucket)</h2>{waits}\
         <h2>Events</h2><table id=\"events\"><tr><th>time (UTC)</th><th>event</th></tr>{events}</table>\
         </body></html>\n",
        generated = esc(&r.generated_at),
    )
}
