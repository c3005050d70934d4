//! Counts as people read them: parameters, elements and tensors with their thousands grouped
//! (`7,255,363,584`), the way every trainmem report writes a count.

/// `124439808` as `124,439,808`.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(grouped(124_439_808), "124,439,808");
        assert_eq!(grouped(7_255_363_584), "7,255,363,584");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(u64::MAX), "18,446,744,073,709,551,615");
    }
}
