//! Medians.

/// The median of `values` (the mean of the two middle ones for an even count); NaN when empty.
/// Reorders `values`.
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// The median of the values `f` gives for `items`; NaN when there are none.
pub fn median_of<T>(items: &[T], f: impl Fn(&T) -> f64) -> f64 {
    let mut values: Vec<f64> = items.iter().map(f).filter(|v| !v.is_nan()).collect();
    median(&mut values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_even_and_empty() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&mut []).is_nan());
        assert_eq!(median_of(&[1.0, f64::NAN, 5.0, 3.0], |v| *v), 3.0);
    }
}
