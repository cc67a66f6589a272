//! Budget schedules: the standard five-field cron Karpenter parses (`robfig/cron`'s
//! `ParseStandard`), always in UTC, and whether a window of `duration` after a hit is open.
//!
//! Fields are minute (0-59), hour (0-23), day of month (1-31), month (1-12 or `JAN`-`DEC`) and
//! day of week (0-6 or `SUN`-`SAT`); each is a comma list of `*`, `?`, `N`, `N-M`, with an
//! optional `/step` (`N/step` runs to the field's maximum). The descriptors `@yearly`,
//! `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly` and `@every D` are
//! accepted. When both day fields are restricted a day matches either (cron's rule); a `*` in
//! one makes the other decide. Time zones are not: a `TZ=` prefix is an error, as is anything
//! else this does not parse, and a budget with an invalid schedule allows nothing.

use std::time::Duration;

use crate::clock::to_millis;
use crate::ledger::Millis;

const MINUTE: Millis = 60_000;
const DAY_MINUTES: u64 = 1_440;
/// Days searched back for the last hit: long enough for a February 29 schedule across a
/// century year that is not a leap year (2096 to 2104).
const SEARCH_DAYS: u64 = 366 * 8 + 1;

/// A parsed schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cron {
    Fields(Fields),
    /// `@every D`: a hit every `D` from whenever it is asked.
    Every(Millis),
}

/// The five fields as bit sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fields {
    minutes: u64,
    hours: u32,
    /// Bits 1..=31.
    days: u32,
    /// Bits 1..=12.
    months: u16,
    /// Bits 0..=6, Sunday first.
    weekdays: u8,
    /// The day-of-month field was `*` or `?` (with no step above 1).
    days_star: bool,
    weekdays_star: bool,
}

const MONTHS: [&str; 12] = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// One field's bounds and names.
struct Bounds {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

impl Cron {
    /// Parses a schedule; the error says what is wrong with it.
    pub fn parse(s: &str) -> Result<Cron, String> {
        let s = s.trim();
        if s.is_empty() {
            return Err("empty schedule".into());
        }
        if s.starts_with("TZ=") || s.starts_with("CRON_TZ=") {
            return Err(format!("schedule {s:?}: time zones are not supported (schedules are UTC)"));
        }
        if let Some(rest) = s.strip_prefix("@every ") {
            let d = crate::nodepool::parse_duration(rest.trim())
                .map_err(|e| format!("schedule {s:?}: {e}"))?
                .filter(|d| !d.is_zero())
                .ok_or_else(|| format!("schedule {s:?}: @every needs a positive duration"))?;
            return Ok(Cron::Every(to_millis(d).max(1_000)));
        }
        let expanded = match s {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            d if d.starts_with('@') => return Err(format!("schedule {s:?}: unknown descriptor")),
            other => other,
        };
        let parts: Vec<&str> = expanded.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(format!("schedule {s:?}: expected 5 fields (minute hour day-of-month month day-of-week)"));
        }
        let parse_field = |i: usize, b: &Bounds| field(parts[i], b).map_err(|e| format!("schedule {s:?}: {e}"));
        let (minutes, _) = parse_field(0, &Bounds { name: "minute", min: 0, max: 59, names: &[] })?;
        let (hours, _) = parse_field(1, &Bounds { name: "hour", min: 0, max: 23, names: &[] })?;
        let (days, days_star) = parse_field(2, &Bounds { name: "day of month", min: 1, max: 31, names: &[] })?;
        let (months, _) = parse_field(3, &Bounds { name: "month", min: 1, max: 12, names: &MONTHS })?;
        let (weekdays, weekdays_star) =
            parse_field(4, &Bounds { name: "day of week", min: 0, max: 6, names: &WEEKDAYS })?;
        Ok(Cron::Fields(Fields {
            minutes,
            hours: hours as u32,
            days: days as u32,
            months: months as u16,
            weekdays: weekdays as u8,
            days_star,
            weekdays_star,
        }))
    }

    /// The last hit at or before `t` (whole minutes), if there is one within the search.
    pub fn last_at_or_before(&self, t: Millis) -> Option<Millis> {
        let f = match self {
            Cron::Fields(f) => f,
            Cron::Every(_) => return Some(t),
        };
        let minute_now = t / MINUTE;
        let today = minute_now / DAY_MINUTES;
        let minute_of_today = minute_now % DAY_MINUTES;
        for back in 0..SEARCH_DAYS {
            let Some(day) = today.checked_sub(back) else { break };
            if !f.day_matches(day) {
                continue;
            }
            let limit = if back == 0 { minute_of_today } else { DAY_MINUTES - 1 };
            if let Some(m) = f.last_minute_until(limit) {
                return Some((day * DAY_MINUTES + m) * MINUTE);
            }
        }
        None
    }

    /// Whether a window of `duration` opened by a hit is open at `now`: some hit falls in
    /// `(now - duration, now]` (Karpenter's `IsActive`: the next hit after `now - duration`
    /// is not after `now`), or the schedule never fires.
    pub fn is_active(&self, now: Millis, duration: Duration) -> bool {
        let d = to_millis(duration);
        match self {
            // The next hit after `now - d` is `now - d + every`.
            Cron::Every(every) => *every <= d,
            // A schedule with no hit (the 30th of February) is active, as in Karpenter: robfig's
            // `Next` returns the zero time, which is not after `now`.
            Cron::Fields(_) => self.last_at_or_before(now).is_none_or(|hit| hit.saturating_add(d) > now),
        }
    }
}

impl Fields {
    fn day_matches(&self, day: u64) -> bool {
        let (_, month, dom) = civil(day);
        if self.months & (1 << month) == 0 {
            return false;
        }
        let weekday = (day + 4) % 7; // 1970-01-01 was a Thursday.
        let dom_ok = self.days & (1 << dom) != 0;
        let dow_ok = self.weekdays & (1 << weekday) != 0;
        if self.days_star || self.weekdays_star { dom_ok && dow_ok } else { dom_ok || dow_ok }
    }

    /// The latest minute of the day at or before `limit` that matches hour and minute.
    fn last_minute_until(&self, limit: u64) -> Option<u64> {
        let (lh, lm) = (limit / 60, limit % 60);
        for h in (0..=lh).rev() {
            if self.hours & (1 << h) == 0 {
                continue;
            }
            let top = if h == lh { lm } else { 59 };
            if let Some(m) = (0..=top).rev().find(|m| self.minutes & (1u64 << m) != 0) {
                return Some(h * 60 + m);
            }
        }
        None
    }
}

/// Year, month (1-12) and day (1-31) of a day counted from 1970-01-01 (proleptic Gregorian;
/// Howard Hinnant's `civil_from_days`).
fn civil(days: u64) -> (i64, u32, u32) {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// One field: its bits, and whether it was a bare `*`/`?`.
fn field(expr: &str, b: &Bounds) -> Result<(u64, bool), String> {
    let mut bits = 0u64;
    let mut star = false;
    for part in expr.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().map_err(|_| format!("{} field {expr:?}: bad step {s:?}", b.name))?;
                if step == 0 {
                    return Err(format!("{} field {expr:?}: step must be positive", b.name));
                }
                (r, Some(step))
            }
            None => (part, None),
        };
        let (start, end, whole) = if range == "*" || range == "?" {
            (b.min, b.max, true)
        } else if let Some((lo, hi)) = range.split_once('-') {
            (value(lo, b, expr)?, value(hi, b, expr)?, false)
        } else {
            let v = value(range, b, expr)?;
            // `N/step` runs to the maximum.
            (v, if step.is_some() { b.max } else { v }, false)
        };
        if start > end {
            return Err(format!("{} field {expr:?}: {start} is after {end}", b.name));
        }
        let step = step.unwrap_or(1);
        star |= whole && step == 1;
        let mut v = start;
        while v <= end {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok((bits, star))
}

fn value(s: &str, b: &Bounds, expr: &str) -> Result<u32, String> {
    let v = match b.names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
        Some(i) => i as u32 + b.min,
        None => s.parse::<u32>().map_err(|_| format!("{} field {expr:?}: {s:?} is not a value", b.name))?,
    };
    if v < b.min || v > b.max {
        return Err(format!("{} field {expr:?}: {v} is outside {}-{}", b.name, b.min, b.max));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Epoch millis of a UTC date and time.
    fn at(y: i64, mo: u32, d: u32, h: u64, mi: u64) -> Millis {
        // days_from_civil
        let y = if mo <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = i64::from(if mo > 2 { mo - 3 } else { mo + 9 });
        let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = (era * 146_097 + doe - 719_468) as u64;
        (days * DAY_MINUTES + h * 60 + mi) * MINUTE
    }

    #[test]
    fn dates_round_trip() {
        for (y, m, d) in [(1970, 1, 1), (2000, 2, 29), (2026, 11, 25), (2100, 3, 1), (2024, 12, 31)] {
            let day = at(y, m, d, 0, 0) / MINUTE / DAY_MINUTES;
            assert_eq!(civil(day), (y, m, d));
        }
        assert_eq!((at(2026, 11, 25, 0, 0) / MINUTE / DAY_MINUTES + 4) % 7, 3, "a Wednesday");
    }

    #[test]
    fn a_business_hours_window_is_open_only_on_weekdays_in_its_hours() {
        // 09:00 UTC Monday to Friday, for 8 hours.
        let c = Cron::parse("0 9 * * mon-fri").expect("parses");
        let eight = Duration::from_secs(8 * 3600);
        assert!(c.is_active(at(2026, 11, 25, 9, 0), eight), "at the hit");
        assert!(c.is_active(at(2026, 11, 25, 16, 59), eight));
        assert!(!c.is_active(at(2026, 11, 25, 17, 0), eight), "the window is (hit, hit + 8h)");
        assert!(!c.is_active(at(2026, 11, 25, 8, 59), eight));
        assert!(!c.is_active(at(2026, 11, 28, 10, 0), eight), "a Saturday");
    }

    #[test]
    fn descriptors_steps_lists_and_the_day_rule() {
        let hour = Duration::from_secs(3600);
        let daily = Cron::parse("@daily").expect("parses");
        assert!(daily.is_active(at(2026, 3, 4, 0, 30), hour));
        assert!(!daily.is_active(at(2026, 3, 4, 1, 0), hour));
        let c = Cron::parse("*/15 2,4 * * *").expect("parses");
        assert_eq!(c.last_at_or_before(at(2026, 3, 4, 4, 44)), Some(at(2026, 3, 4, 4, 30)));
        assert_eq!(c.last_at_or_before(at(2026, 3, 4, 3, 59)), Some(at(2026, 3, 4, 2, 45)));
        // Both day fields restricted: either matches (the 1st, or any Sunday).
        let either = Cron::parse("0 0 1 * sun").expect("parses");
        assert_eq!(either.last_at_or_before(at(2026, 11, 25, 12, 0)), Some(at(2026, 11, 22, 0, 0)), "a Sunday");
        // `*/2` in the day of month is a restriction, not a star.
        let odd_days = Cron::parse("0 0 */2 * mon").expect("parses");
        assert_eq!(odd_days.last_at_or_before(at(2026, 11, 25, 12, 0)), Some(at(2026, 11, 25, 0, 0)), "the 25th");
        let leap = Cron::parse("0 0 29 feb *").expect("parses");
        assert_eq!(leap.last_at_or_before(at(2026, 11, 25, 0, 0)), Some(at(2024, 2, 29, 0, 0)));
        let never = Cron::parse("0 0 30 feb *").expect("parses");
        assert!(never.is_active(at(2026, 3, 4, 0, 30), hour), "a schedule that never fires is active, as in Karpenter");
        let every = Cron::parse("@every 30m").expect("parses");
        assert!(every.is_active(0, hour) && !every.is_active(0, Duration::from_secs(60)));
    }

    #[test]
    fn what_is_not_a_schedule_is_an_error_that_says_why() {
        for (bad, says) in [
            ("", "empty"),
            ("0 9 * *", "5 fields"),
            ("60 * * * *", "outside 0-59"),
            ("0 9 * * 7", "outside 0-6"),
            ("0 9 * * mon-xyz", "not a value"),
            ("0 9 5-1 * *", "after"),
            ("*/0 * * * *", "step must be positive"),
            ("@fortnightly", "unknown descriptor"),
            ("TZ=Europe/Paris 0 9 * * *", "time zones"),
            ("@every 0s", "positive duration"),
        ] {
            let e = Cron::parse(bad).expect_err(bad);
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
