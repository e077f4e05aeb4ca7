//! Phase spans reduced to what a picture can show. Each span goes to a lane: marks in the
//! first, ranges below by nesting depth (the deepest lanes folded into the last one). In a
//! lane, spans narrower than a pixel that fall within one pixel column are merged into one bar
//! (named when they share a name, counted otherwise), so a lane holds about one bar per pixel
//! column at most, whatever the number of spans; a span of a pixel or more is its own bar.

use crate::read::phases::PhaseSpan;

/// Range depths drawn in lanes of their own; deeper ranges share the last one.
pub const MAX_DEPTH_LANES: usize = 6;
/// Distinct names a merged bar lists.
const NAMES_LISTED: usize = 3;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bar {
    pub lane: usize,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Distinct names of its spans, the first few (see `mixed`).
    pub names: Vec<String>,
    /// Its spans have more than one name.
    pub mixed: bool,
    /// Spans merged into it.
    pub spans: u64,
    pub mark: bool,
    /// Nesting depth of its first span.
    pub depth: u32,
}

impl Bar {
    /// What the bar says: its name, or how many phases it stands for.
    pub fn label(&self) -> String {
        match (self.mixed, self.spans) {
            (false, 1) => self.names[0].clone(),
            (false, n) => format!("{} ×{n}", self.names[0]),
            (true, n) => format!("{n} phases"),
        }
    }
}

#[derive(Debug, Default)]
pub struct Lanes {
    pub bars: Vec<Bar>,
    /// Lanes used; and what each is (`None`: marks; `Some(d)`: ranges of depth d, the last
    /// lane also the deeper ones).
    pub kinds: Vec<Option<usize>>,
    /// Spans drawn (as bars of their own or merged).
    pub spans: u64,
    /// Spans merged into a bar with others.
    pub merged: u64,
    /// Ranges deeper than the lanes, drawn in the last one.
    pub folded: u64,
}

/// The lanes of `spans` over `[0, end_ns]` drawn `width` pixels wide.
pub fn lanes(spans: &[PhaseSpan], end_ns: u64, width: f64) -> Lanes {
    let has_marks = spans.iter().any(|s| s.mark);
    let deepest = spans.iter().filter(|s| !s.mark).map(|s| s.depth as usize).max();
    let mut out = Lanes::default();
    if has_marks {
        out.kinds.push(None);
    }
    let first_range = out.kinds.len();
    if let Some(d) = deepest {
        out.kinds.extend((0..=d.min(MAX_DEPTH_LANES - 1)).map(Some));
    }
    let px = |t: u64| t as f64 / end_ns.max(1) as f64 * width;
    // The bar being built per lane, and where its pixel column ends.
    let mut open: Vec<Option<(Bar, f64, bool)>> = vec![None; out.kinds.len()];
    for s in spans {
        let lane = if s.mark {
            0
        } else {
            let d = s.depth as usize;
            if d >= MAX_DEPTH_LANES {
                out.folded += 1;
            }
            first_range + d.min(MAX_DEPTH_LANES - 1)
        };
        out.spans += s.count;
        let (a, b) = (px(s.start_ns), px(s.end_ns));
        let narrow = b - a < 1.0;
        if let Some((bar, col_end, bar_narrow)) = &mut open[lane] {
            // Within the bar's pixel; or, of its one name, less than a pixel after it.
            let same = !bar.mixed && bar.names[0] == s.name;
            if narrow && *bar_narrow && (a < *col_end || (same && a < *col_end + 1.0)) {
                bar.end_ns = bar.end_ns.max(s.end_ns);
                *col_end = col_end.max(b);
                bar.spans += s.count;
                out.merged += if bar.spans == 2 { 2 } else { 1 };
                if !bar.names.contains(&s.name) {
                    bar.mixed = true;
                    if bar.names.len() < NAMES_LISTED {
                        bar.names.push(s.name.clone());
                    }
                }
                continue;
            }
        }
        let bar = Bar {
            lane,
            start_ns: s.start_ns,
            end_ns: s.end_ns,
            names: vec![s.name.clone()],
            mixed: false,
            spans: s.count,
            mark: s.mark,
            depth: s.depth,
        };
        let col_end = b.max(a.floor() + 1.0);
        if let Some((done, _, _)) = open[lane].replace((bar, col_end, narrow)) {
            out.bars.push(done);
        }
    }
    out.bars.extend(open.into_iter().flatten().map(|(b, _, _)| b));
    out.bars.sort_by_key(|b| (b.lane, b.start_ns));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(name: &str, depth: u32, mark: bool, start_ns: u64, end_ns: u64) -> PhaseSpan {
        PhaseSpan { name: name.into(), tid: 1, depth, mark, start_ns, end_ns, count: 1 }
    }

    #[test]
    fn nested_ranges_get_lanes_by_depth_below_the_marks() {
        let spans = [
            span("epoch 1", 0, true, 0, 500),
            span("forward", 0, false, 0, 300),
            span("attention", 1, false, 100, 200),
            span("softmax", 2, false, 120, 150),
            span("epoch 2", 0, true, 500, 1000),
        ];
        let l = lanes(&spans, 1000, 1000.0);
        assert_eq!(l.kinds, [None, Some(0), Some(1), Some(2)]);
        let got: Vec<(usize, String)> = l.bars.iter().map(|b| (b.lane, b.label())).collect();
        assert_eq!(
            got,
            [(0, "epoch 1".into()), (0, "epoch 2".into()), (1, "forward".into()), (2, "attention".into()), (3, "softmax".into())]
        );
        assert_eq!((l.spans, l.merged, l.folded), (5, 0, 0));
    }

    #[test]
    fn a_hundred_thousand_spans_make_at_most_a_bar_per_pixel() {
        // 100,000 steps of 10 ns each over 1 ms, 1000 pixels wide: 100 spans per pixel.
        let spans: Vec<PhaseSpan> = (0..100_000u64)
            .map(|i| span(if i % 2 == 0 { "step" } else { "sync" }, 0, false, i * 10, i * 10 + 9))
            .collect();
        let l = lanes(&spans, 1_000_000, 1000.0);
        assert!(l.bars.len() <= 1001, "{} bars", l.bars.len());
        assert_eq!(l.spans, 100_000);
        assert_eq!(l.merged, 100_000);
        let covered: u64 = l.bars.iter().map(|b| b.spans).sum();
        assert_eq!(covered, 100_000, "every span is in a bar");
        assert_eq!(l.bars[0].label(), "100 phases");
        assert_eq!(l.bars[0].names, ["step", "sync"]);
        // A wide span among them keeps its name and extent.
        let mut spans = spans;
        spans.push(span("eval", 0, false, 1_000_000, 2_000_000));
        let l = lanes(&spans, 2_000_000, 1000.0);
        let last = l.bars.last().unwrap();
        assert_eq!((last.label(), last.start_ns, last.end_ns), ("eval".into(), 1_000_000, 2_000_000));
    }

    #[test]
    fn repeated_narrow_spans_of_one_name_say_how_many_and_deep_ranges_fold() {
        let mut spans: Vec<PhaseSpan> = (0..10u64).map(|i| span("step", 0, false, i, i + 1)).collect();
        spans.extend((0..9u32).map(|d| span("deep", d, false, 100 + u64::from(d), 900)));
        let l = lanes(&spans, 1000, 100.0);
        assert_eq!(l.bars[0].label(), "step ×10");
        // Spans of one name with gaps narrower than a pixel between them: one bar too.
        let gapped: Vec<PhaseSpan> = (0..1000u64).map(|i| span("forward", 1, false, i * 10 + 1, i * 10 + 9)).collect();
        let l = lanes(&gapped, 10_000, 100.0);
        assert_eq!(l.bars.len(), 1);
        assert_eq!(l.bars[0].label(), "forward ×1000");
        let l = lanes(&spans, 1000, 100.0);
        assert_eq!(l.kinds.len(), MAX_DEPTH_LANES);
        assert_eq!(l.folded, 3, "depths 6, 7 and 8 share the last lane");
        assert_eq!(l.bars.iter().filter(|b| b.lane == MAX_DEPTH_LANES - 1).count(), 4);
    }
}
