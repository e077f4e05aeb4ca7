//! A series drawn per pixel column: the lowest and highest live bytes of the model's buckets
//! that fall in each column. The model's buckets keep the exact minimum and maximum of every
//! event in them (see `model::timeseries`), so the columns do too: a peak is never lost, however
//! many events share a pixel.

/// One column: `[x0, x1)` in pixels, the extremes in it and the value it ends at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    pub x0: u32,
    pub x1: u32,
    pub min: u64,
    pub max: u64,
    pub last: u64,
}

/// Columns of `points` (`(bucket start ns, min, max, last)`, as `Series::points` gives them,
/// buckets `bucket_ns` wide) over `[0, end_ns]` drawn in `columns` pixels. Consecutive columns
/// with one flat value are joined. The last value holds to the right edge.
pub fn columns(points: &[(u64, u64, u64, u64)], bucket_ns: u64, end_ns: u64, columns: u32) -> Vec<Column> {
    let col = |t: u64| ((t as f64 / end_ns.max(1) as f64) * f64::from(columns)).floor().min(f64::from(columns - 1)) as u32;
    let mut out: Vec<Column> = Vec::new();
    for &(t, lo, hi, last) in points {
        // A bucket can span several columns: it lies in those from its start to its end.
        let (c0, c1) = (col(t), col(t.saturating_add(bucket_ns).saturating_sub(1)).max(col(t)));
        match out.last_mut() {
            Some(c) if c.x1 > c0 => {
                c.min = c.min.min(lo);
                c.max = c.max.max(hi);
                c.last = last;
                c.x1 = c.x1.max(c1 + 1);
            }
            _ => out.push(Column { x0: c0, x1: c1 + 1, min: lo, max: hi, last }),
        }
    }
    // Columns left of the first point hold 0; from the last one on, its last value.
    if let Some(c) = out.last() {
        if c.x1 < columns {
            let v = c.last;
            out.push(Column { x0: c.x1, x1: columns, min: v, max: v, last: v });
        }
    }
    let mut joined: Vec<Column> = Vec::with_capacity(out.len());
    for c in out {
        let Some(p) = joined.last().copied() else {
            joined.push(c);
            continue;
        };
        if p.min == p.max && c.min == c.max && p.max == c.max && p.x1 == c.x0 {
            let last = joined.last_mut().expect("not empty");
            last.x1 = c.x1;
            last.last = c.last;
            continue;
        }
        if p.x1 < c.x0 {
            // Between buckets nothing happened: the previous value holds.
            let v = p.last;
            joined.push(Column { x0: p.x1, x1: c.x0, min: v, max: v, last: v });
        }
        joined.push(c);
    }
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spike_narrower_than_a_pixel_keeps_its_height() {
        // 4096 buckets of 1 µs, one of them a 1-byte-wide... spike to 1000 bytes.
        let mut points: Vec<(u64, u64, u64, u64)> = (0..4096u64).map(|i| (i * 1000, 10, 10, 10)).collect();
        points[2049] = (2049 * 1000, 10, 1000, 10);
        let c = columns(&points, 1000, 4096 * 1000, 1000);
        assert_eq!(c.iter().map(|c| c.max).max(), Some(1000));
        assert_eq!(c.iter().filter(|c| c.max == 1000).count(), 1);
        assert!(c.len() <= 3, "flat stretches are joined: {c:?}");
        assert_eq!((c[0].x0, c.last().unwrap().x1), (0, 1000));
    }

    #[test]
    fn columns_cover_the_width_and_hold_the_last_value() {
        // Two buckets of 100 ns over 1000 ns, 10 columns: the rest holds the last value.
        let c = columns(&[(0, 0, 50, 50), (100, 20, 50, 20)], 100, 1000, 10);
        assert_eq!(
            c,
            [
                Column { x0: 0, x1: 1, min: 0, max: 50, last: 50 },
                Column { x0: 1, x1: 2, min: 20, max: 50, last: 20 },
                Column { x0: 2, x1: 10, min: 20, max: 20, last: 20 },
            ]
        );
    }
}
