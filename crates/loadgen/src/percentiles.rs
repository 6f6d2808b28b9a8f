//! A sample of times summarised for the JSON report: the usual percentiles, and the
//! sample at every whole percentile, from which a plot draws its distribution.

use serde::Serialize;

/// Percentiles of a sample, in milliseconds.
#[derive(Debug, Default, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    /// The sample at percentiles 1, 2, ..., 100 (the nearest-rank method), empty for an
    /// empty sample.
    pub by_percent: Vec<f64>,
}

impl Percentiles {
    pub fn of(mut ms: Vec<f64>) -> Percentiles {
        if ms.is_empty() {
            return Percentiles::default();
        }
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
        Percentiles {
            count: ms.len(),
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
            max: ms[ms.len() - 1],
            by_percent: (1..=100).map(|p| at(f64::from(p) / 100.0)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Percentiles;

    #[test]
    fn percentiles_are_nearest_ranks_of_the_sorted_sample() {
        let p = Percentiles::of((1..=200).rev().map(f64::from).collect());
        assert_eq!(
            (p.count, p.p50, p.p95, p.p99, p.max),
            (200, 100.0, 190.0, 198.0, 200.0)
        );
        assert_eq!(p.by_percent.len(), 100);
        assert_eq!(
            (p.by_percent[0], p.by_percent[49], p.by_percent[99]),
            (2.0, 100.0, 200.0)
        );
        let one = Percentiles::of(vec![7.0]);
        assert_eq!((one.p50, one.max, one.by_percent[0]), (7.0, 7.0, 7.0));
        assert!(Percentiles::of(Vec::new()).by_percent.is_empty());
    }
}
