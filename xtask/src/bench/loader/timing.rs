//! Repeated timings summarised as median, min and max.

use std::time::Instant;

/// Median, min and max of a set of measurements.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    /// The median (the mean of the two middle values for an even count).
    pub median: f64,
    /// The smallest.
    pub min: f64,
    /// The largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (NaN everywhere when empty).
    pub fn of(values: &[f64]) -> Spread {
        let mut v: Vec<f64> = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            return Spread {
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
            };
        }
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Spread {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }

    /// The same spread with every value mapped by a decreasing function `f` (seconds to a
    /// rate): min and max swap.
    pub fn map_decreasing(self, f: impl Fn(f64) -> f64) -> Spread {
        Spread {
            median: f(self.median),
            min: f(self.max),
            max: f(self.min),
        }
    }
}

/// Seconds of each of `repeats` timed runs (at least one), after one untimed warm-up run.
pub fn timed(
    repeats: usize,
    mut run: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<f64>> {
    run()?;
    let mut out = Vec::with_capacity(repeats.max(1));
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        run()?;
        out.push(t.elapsed().as_secs_f64());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_max() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let s = Spread::of(&[4.0, 1.0, 2.0, 3.0]);
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 4.0));
        assert!(Spread::of(&[]).median.is_nan());
        let r = Spread::of(&[1.0, 2.0, 4.0]).map_decreasing(|s| 8.0 / s);
        assert_eq!((r.median, r.min, r.max), (4.0, 2.0, 8.0));
    }

    #[test]
    fn timed_runs_warm_up_then_repeats() {
        let mut calls = 0;
        let t = timed(5, || {
            calls += 1;
            Ok(())
        })
        .expect("runs");
        assert_eq!((t.len(), calls), (5, 6));
        assert!(timed(3, || anyhow::bail!("fails")).is_err());
    }
}
