//! Kubernetes resource quantities (`100m`, `1.5`, `2Gi`, `1e3`, `500M`), parsed the way
//! `k8s.io/apimachinery/pkg/api/resource.ParseQuantity` parses them.
//!
//! A [`Quantity`] holds its exact value as a count of nano-units (10^-9), which covers
//! every suffix Kubernetes accepts. Like Kubernetes, values finer than one nano-unit are
//! rounded away from zero. The input's format (decimal SI, binary SI or decimal exponent)
//! is remembered so [`Quantity`]'s `Display` writes the canonical form Kubernetes would.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// How a quantity was written, which decides how it is printed back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Format {
    /// `Ki`, `Mi`, ... `Ei`.
    BinarySi,
    /// `n`, `u`, `m`, ``, `k`, `M`, ... `E`.
    #[default]
    DecimalSi,
    /// `1e3`, `5E-3`.
    DecimalExponent,
}

/// An exact Kubernetes quantity.
///
/// Equality and ordering compare values only, never the format: `1Gi == 1073741824`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

/// Why a string is not a quantity. Messages follow apimachinery's wording.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]
    Format,
    #[error("unable to parse quantity's suffix")]
    Suffix,
    #[error("quantity is out of the supported range")]
    Range,
}

const NANO: i128 = 1_000_000_000;
/// The largest magnitude accepted, in nano-units (about 10^38 / 10): far beyond any real
/// resource and small enough that sums of many such values cannot overflow `i128`.
const MAX_NANOS: i128 = i128::MAX / 16;

impl Quantity {
    /// A quantity of `n` whole units in decimal SI format.
    pub const fn from_units(n: i64) -> Self {
        Quantity { nanos: n as i128 * NANO, format: Format::DecimalSi }
    }

    /// A quantity of `n` thousandths (millicores for CPU).
    pub const fn from_milli(n: i64) -> Self {
        Quantity { nanos: n as i128 * 1_000_000, format: Format::DecimalSi }
    }

    /// A quantity of `n` units printed in binary SI (`Ki`, `Mi`, ...) where possible.
    pub const fn from_units_binary(n: i64) -> Self {
        Quantity { nanos: n as i128 * NANO, format: Format::BinarySi }
    }

    /// The exact value in nano-units.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    /// The format the quantity was written in.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The value in thousandths, rounded up like apimachinery's `MilliValue`.
    pub fn milli_value(&self) -> i64 {
        clamp_i64(div_ceil(self.nanos, 1_000_000))
    }

    /// The value in whole units, rounded up like apimachinery's `Value`.
    pub fn value(&self) -> i64 {
        clamp_i64(div_ceil(self.nanos, NANO))
    }

    /// Whether the value is exactly zero.
    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// The value as a float, for display and ratios only.
    pub fn as_f64(&self) -> f64 {
        self.nanos as f64 / NANO as f64
    }
}

fn div_ceil(n: i128, d: i128) -> i128 {
    // Rounds away from zero for negative values too, as `inf.RoundUp` does.
    let q = n / d;
    if n % d == 0 {
        q
    } else if n > 0 {
        q + 1
    } else {
        q - 1
    }
}

fn clamp_i64(v: i128) -> i64 {
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}
impl Eq for Quantity {}
impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}
impl std::hash::Hash for Quantity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.nanos.hash(state)
    }
}

/// The pieces of a quantity string, as apimachinery's `parseQuantityString` scans them.
struct Scanned<'a> {
    positive: bool,
    num: &'a str,
    denom: &'a str,
    suffix: &'a str,
}

fn scan(s: &str) -> Result<Scanned<'_>, QuantityError> {
    let b = s.as_bytes();
    let end = b.len();
    let mut pos = 0;
    let mut positive = true;
    if pos < end {
        match b[0] {
            b'-' => {
                positive = false;
                pos += 1;
            }
            b'+' => pos += 1,
            _ => {}
        }
    }
    // Leading zeros.
    while pos < end && b[pos] == b'0' {
        pos += 1;
    }
    if pos >= end {
        return Ok(Scanned { positive, num: "0", denom: "", suffix: "" });
    }
    let num_start = pos;
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    let mut num = &s[num_start..pos];
    if num.is_empty() {
        num = "0";
    }
    let mut denom = "";
    if pos < end && b[pos] == b'.' {
        pos += 1;
        let d_start = pos;
        while pos < end && b[pos].is_ascii_digit() {
            pos += 1;
        }
        denom = &s[d_start..pos];
    }
    let suffix_start = pos;
    while pos < end && b"eEinumkKMGTP".contains(&b[pos]) {
        pos += 1;
    }
    if pos < end && (b[pos] == b'-' || b[pos] == b'+') {
        pos += 1;
    }
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    if pos < end {
        return Err(QuantityError::Format);
    }
    Ok(Scanned { positive, num, denom, suffix: &s[suffix_start..] })
}

/// What a suffix means: a power of ten or a power of two, and the format it implies.
enum Scale {
    Ten(i32, Format),
    Two(u32),
}

fn interpret_suffix(suffix: &str) -> Result<Scale, QuantityError> {
    let ten = |e| Ok(Scale::Ten(e, Format::DecimalSi));
    match suffix {
        "" => ten(0),
        "n" => ten(-9),
        "u" => ten(-6),
        "m" => ten(-3),
        "k" => ten(3),
        "M" => ten(6),
        "G" => ten(9),
        "T" => ten(12),
        "P" => ten(15),
        "E" => ten(18),
        "Ki" => Ok(Scale::Two(10)),
        "Mi" => Ok(Scale::Two(20)),
        "Gi" => Ok(Scale::Two(30)),
        "Ti" => Ok(Scale::Two(40)),
        "Pi" => Ok(Scale::Two(50)),
        "Ei" => Ok(Scale::Two(60)),
        _ => {
            let rest = suffix.strip_prefix(['e', 'E']).ok_or(QuantityError::Suffix)?;
            let exp: i32 = rest.parse().map_err(|_| QuantityError::Suffix)?;
            Ok(Scale::Ten(exp, Format::DecimalExponent))
        }
    }
}

/// Multiplies `digits` (a decimal string) into a big value, failing when out of range.
fn digits_value(digits: &str) -> Result<i128, QuantityError> {
    let mut v: i128 = 0;
    for c in digits.bytes() {
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add((c - b'0') as i128))
            .filter(|v| *v <= MAX_NANOS)
            .ok_or(QuantityError::Range)?;
    }
    Ok(v)
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(QuantityError::Format);
        }
        let sc = scan(s)?;
        let scale = interpret_suffix(sc.suffix)?;
        // value = (num . denom) * scale, computed exactly as mantissa * 10^exp10 * 2^exp2,
        // then converted to nanos with rounding away from zero.
        let denom = sc.denom.trim_end_matches('0');
        let mantissa = digits_value(&format!("{}{}", sc.num, denom))?;
        let mut exp10: i32 = -(denom.len() as i32) + 9; // nanos
        let (exp2, format) = match scale {
            Scale::Ten(e, f) => {
                // An exponent this far out cannot give a value in range (`1e2147483647`).
                exp10 = exp10.checked_add(e).ok_or(QuantityError::Range)?;
                (0, f)
            }
            Scale::Two(e) => (e, Format::BinarySi),
        };
        let mut v = mantissa.checked_mul(1i128 << exp2).ok_or(QuantityError::Range)?;
        if v == 0 {
            return Ok(Quantity { nanos: 0, format });
        }
        if exp10 >= 0 {
            for _ in 0..exp10 {
                v = v.checked_mul(10).filter(|v| *v <= MAX_NANOS).ok_or(QuantityError::Range)?;
            }
        } else {
            let mut inexact = false;
            for _ in 0..exp10.unsigned_abs() {
                if v % 10 != 0 {
                    inexact = true;
                }
                v /= 10;
                if v == 0 {
                    break;
                }
            }
            if inexact || v == 0 {
                v += 1; // round away from zero to the next nano
            }
        }
        if v > MAX_NANOS {
            return Err(QuantityError::Range);
        }
        // Like apimachinery, a binary quantity below one unit prints as decimal.
        let format = if format == Format::BinarySi && v < NANO { Format::DecimalSi } else { format };
        Ok(Quantity { nanos: if sc.positive { v } else { -v }, format })
    }
}

impl fmt::Display for Quantity {
    /// The canonical form apimachinery's `Quantity.String()` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.nanos;
        if n == 0 {
            return f.write_str("0");
        }
        let sign = if n < 0 { "-" } else { "" };
        let a = n.unsigned_abs();
        if self.format == Format::BinarySi && a.is_multiple_of(NANO as u128) {
            let units = a / NANO as u128;
            if units >= 1024 {
                let suffixes = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
                let mut m = units;
                let mut i = 0;
                while i < 6 && m.is_multiple_of(1024) {
                    m /= 1024;
                    i += 1;
                }
                return write!(f, "{sign}{m}{}", suffixes[i]);
            }
        }
        // Decimal: the largest exponent that is a multiple of 3 and keeps the mantissa whole.
        let mut m = a;
        let mut exp: i32 = -9;
        while m.is_multiple_of(1000) && exp < 18 {
            m /= 1000;
            exp += 3;
        }
        if self.format == Format::DecimalExponent {
            if exp == 0 {
                return write!(f, "{sign}{m}");
            }
            return write!(f, "{sign}{m}e{exp}");
        }
        let suffix = match exp {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            0 => "",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            _ => "E",
        };
        write!(f, "{sign}{m}{suffix}")
    }
}

impl serde::Serialize for Quantity {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a Kubernetes quantity such as \"100m\" or \"2Gi\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity::from_units(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
                i64::try_from(v).map(Quantity::from_units).map_err(E::custom)
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
                format!("{v}").parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(q("100m").milli_value(), 100);
        assert_eq!(q("1.5").milli_value(), 1500);
        assert_eq!(q("2Gi").value(), 2 * 1024 * 1024 * 1024);
        assert_eq!(q("1e3").value(), 1000);
        assert_eq!(q("500M").value(), 500_000_000);
        assert_eq!(q("0.5Gi").value(), 512 * 1024 * 1024);
        assert_eq!(q("+1k").value(), 1000);
        assert_eq!(q("-2").value(), -2);
        assert_eq!(q("1E-3").milli_value(), 1);
        assert_eq!(q(".5").milli_value(), 500);
        assert_eq!(q("1.G").value(), 1_000_000_000);
        assert_eq!(q("0").value(), 0);
        assert_eq!(q("000").value(), 0);
    }

    #[test]
    fn a_binary_whole_number_that_is_not_a_multiple_of_1024_prints_as_apimachinery_does() {
        // apimachinery's CanonicalizeBytes keeps BinarySI for a whole value >= 1024 and prints
        // it with the largest 1024 power that divides it, here none: "793024000". Parsed
        // again, that string has no suffix, so it is DecimalSI and prints as "793024k". The
        // value never changes; the text is stable from the second print on.
        let first = q("774437.50Ki");
        assert_eq!(first.to_string(), "793024000");
        let second = q(&first.to_string());
        assert_eq!(second, first);
        assert_eq!(second.to_string(), "793024k");
        assert_eq!(q("793024k").to_string(), "793024k");
    }

    #[test]
    fn rounds_sub_nano_values_away_from_zero() {
        assert_eq!(q("0.1n").nanos(), 1);
        assert_eq!(q("-0.1n").nanos(), -1);
        assert_eq!(q("1.0000000001").nanos(), 1_000_000_001);
        assert_eq!(q("1m").value(), 1, "Value() rounds up");
        assert_eq!(q("0.1m").milli_value(), 1, "MilliValue() rounds up");
    }

    #[test]
    fn exponents_at_the_ends_of_i32_are_out_of_range_not_a_panic() {
        assert_eq!("1e2147483647".parse::<Quantity>(), Err(QuantityError::Range));
        assert_eq!("1e99999999999".parse::<Quantity>(), Err(QuantityError::Suffix));
        assert_eq!(q("1e-2147483648").nanos(), 1, "rounds away from zero");
        assert_eq!(q("0.000000001e-2147483648").nanos(), 1);
    }

    #[test]
    fn rejects_what_kubernetes_rejects() {
        for bad in ["", "abc", "1x", "1Gb", "1 Gi", "1e", "1e+", "1Ki2", "--1", "1.2.3", " 1"] {
            assert!(bad.parse::<Quantity>().is_err(), "{bad:?} should be rejected");
        }
        assert_eq!("1e400".parse::<Quantity>(), Err(QuantityError::Range));
        assert_eq!("1Qi".parse::<Quantity>(), Err(QuantityError::Format));
        assert_eq!("1iK".parse::<Quantity>(), Err(QuantityError::Suffix));
    }

    #[test]
    fn accepts_apimachinery_quirks() {
        // apimachinery's scanner reads a missing number as zero.
        assert!(q("Gi").is_zero());
        assert!(q("-").is_zero());
        assert!(q(".").is_zero());
        assert_eq!(q("0.0001Ki").to_string(), "102400u", "sub-unit binary values print as decimal");
    }

    #[test]
    fn prints_canonical_forms() {
        for (input, canonical) in [
            ("1.5", "1500m"),
            ("1000m", "1"),
            ("1000", "1k"),
            ("1500", "1500"),
            ("2Gi", "2Gi"),
            ("1536Mi", "1536Mi"),
            ("1024", "1024"),
            ("1Ki", "1Ki"),
            ("0.5Gi", "512Mi"),
            ("1e3", "1e3"),
            ("1.5e3", "1500"),
            ("500M", "500M"),
            ("100m", "100m"),
            ("-1.5", "-1500m"),
            ("0.1n", "1n"),
            ("512", "512"),
        ] {
            assert_eq!(q(input).to_string(), canonical, "{input}");
        }
    }

    #[test]
    fn compares_values_not_formats() {
        assert_eq!(q("1Gi"), q("1073741824"));
        assert!(q("1Gi") > q("1G"));
        assert_eq!(q("1"), q("1000m"));
    }
}
