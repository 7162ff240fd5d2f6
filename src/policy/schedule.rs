//! `[[tenant.schedule]]`: time windows in which other limits hold (a backup window, a batch
//! night). This module parses the window (`days`, `from`, `to`) and answers two questions for a
//! given instant and time zone: which windows are in force, and when the next one opens or
//! closes. It never reads the clock: the daemon passes `now` (tests pass fixed instants and a
//! fixed zone such as Europe/Berlin).
//!
//! A window opens on each listed day at `from` (local time) and closes at the next `to` after
//! it: `to` earlier than `from` (or equal) means the next day, so `Fri 22:00-06:00` lasts until
//! Saturday 06:00. Daylight-saving changes are resolved the way a wall clock reads: a time the
//! spring-forward change skips (02:30 in Berlin on the last Sunday of March) means the moment
//! the clock jumps (03:00 CEST); a time the fall-back change repeats means its first occurrence.
//! So a window never opens twice on one day and never vanishes.

use chrono::{DateTime, Datelike, Duration, NaiveDate, NaiveDateTime, TimeZone, Utc};

use super::Origin;

/// Minutes in a day; `to = "24:00"` is allowed and means midnight at the end of the day.
const DAY: u32 = 24 * 60;

#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Monday = 0 ... Sunday = 6.
    pub days: [bool; 7],
    /// Minutes after local midnight.
    pub from: u32,
    pub to: u32,
    /// The keys it sets (`io.read_bps`), for `status` and the overlap warning.
    pub keys: Vec<String>,
    /// Where `[[tenant.schedule]]` was written.
    pub origin: Origin,
    /// How it reads: `Mon-Fri 22:00-06:00`.
    pub label: String,
}

const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

fn day_index(s: &str) -> Option<usize> {
    let l = s.trim().to_ascii_lowercase();
    DAY_NAMES.iter().position(|d| l == *d || full_name(d) == l)
}

fn full_name(short: &str) -> String {
    match short {
        "mon" => "monday",
        "tue" => "tuesday",
        "wed" => "wednesday",
        "thu" => "thursday",
        "fri" => "friday",
        "sat" => "saturday",
        _ => "sunday",
    }
    .to_string()
}

/// `"Mon-Fri"`, `"Sat,Sun"`, `"Fri-Mon"` (a range may wrap past Sunday), `"daily"`.
pub fn parse_days(text: &str) -> Result<[bool; 7], String> {
    let mut days = [false; 7];
    let t = text.trim();
    if t.eq_ignore_ascii_case("daily") || t == "*" {
        return Ok([true; 7]);
    }
    if t.is_empty() {
        return Err("no days given; write e.g. \"Mon-Fri\", \"Sat,Sun\" or \"daily\"".into());
    }
    for part in t.split(',') {
        let bad = || {
            format!("`{}` is not a day or a range of days; write e.g. \"Mon-Fri\", \"Sat,Sun\" or \"daily\"", part.trim())
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (day_index(a).ok_or_else(bad)?, day_index(b).ok_or_else(bad)?);
                let mut d = a;
                loop {
                    days[d] = true;
                    if d == b {
                        break;
                    }
                    d = (d + 1) % 7;
                }
            }
            None => days[day_index(part).ok_or_else(bad)?] = true,
        }
    }
    Ok(days)
}

/// `"HH:MM"`, 00:00 to 23:59 (and 24:00 when `end_of_day` is allowed), as minutes.
pub fn parse_time(text: &str, allow_24: bool) -> Result<u32, String> {
    let bad = || format!("`{text}` is not a time of day; write it as \"HH:MM\", e.g. \"22:00\"");
    let (h, m) = text.trim().split_once(':').ok_or_else(bad)?;
    if h.is_empty() || h.len() > 2 || m.len() != 2 {
        return Err(bad());
    }
    let h: u32 = h.parse().map_err(|_| bad())?;
    let m: u32 = m.parse().map_err(|_| bad())?;
    if m > 59 || h > 24 || (h == 24 && (m != 0 || !allow_24)) {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

fn hhmm(m: u32) -> String {
    format!("{:02}:{:02}", m / 60, m % 60)
}

/// `Mon-Fri`-style text for a day set.
pub fn days_label(days: &[bool; 7]) -> String {
    if days.iter().all(|d| *d) {
        return "daily".into();
    }
    let name = |i: usize| {
        let mut n = DAY_NAMES[i].to_string();
        n[..1].make_ascii_uppercase();
        n
    };
    let mut parts = Vec::new();
    let mut i = 0;
    while i < 7 {
        if days[i] {
            let start = i;
            while i + 1 < 7 && days[i + 1] {
                i += 1;
            }
            parts.push(if i == start {
                name(i)
            } else {
                format!("{}-{}", name(start), name(i))
            });
        }
        i += 1;
    }
    parts.join(",")
}

pub fn label(days: &[bool; 7], from: u32, to: u32) -> String {
    format!("{} {}-{}", days_label(days), hhmm(from), hhmm(to))
}

impl Schedule {
    /// Minutes the window lasts (a `to` at or before `from` is on the next day).
    fn length(&self) -> u32 {
        if self.to > self.from {
            self.to - self.from
        } else {
            self.to + DAY - self.from
        }
    }

    /// The minutes of a week (Monday 00:00 = 0) in which the window is open, ignoring
    /// daylight-saving changes: for the overlap warning of `check`.
    pub fn week_minutes(&self) -> Vec<bool> {
        let week = 7 * DAY as usize;
        let mut open = vec![false; week];
        for (d, on) in self.days.iter().enumerate() {
            if *on {
                let start = d * DAY as usize + self.from as usize;
                for m in 0..self.length() as usize {
                    open[(start + m) % week] = true;
                }
            }
        }
        open
    }

    /// The windows (as instants) that open on the days from `first` for `count` days.
    fn intervals<Tz: TimeZone>(
        &self,
        tz: &Tz,
        first: NaiveDate,
        count: i64,
    ) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
        let mut out = Vec::new();
        for i in 0..count {
            let day = first + Duration::days(i);
            if !self.days[day.weekday().num_days_from_monday() as usize] {
                continue;
            }
            let midnight = day.and_hms_opt(0, 0, 0).expect("midnight exists");
            let open = resolve(tz, midnight + Duration::minutes(self.from as i64));
            let close = resolve(
                tz,
                midnight + Duration::minutes((self.from + self.length()) as i64),
            );
            if close > open {
                out.push((open, close));
            }
        }
        out
    }

    fn around<Tz: TimeZone>(&self, now: &DateTime<Tz>) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
        let today = now.naive_local().date();
        // A window opened yesterday may still be open; the next boundary is at most 8 days on.
        self.intervals(&now.timezone(), today - Duration::days(2), 11)
    }

    /// Whether the window is open at `now`.
    pub fn is_open<Tz: TimeZone>(&self, now: &DateTime<Tz>) -> bool {
        let t = now.with_timezone(&Utc);
        self.around(now).iter().any(|(a, b)| *a <= t && t < *b)
    }

    /// The first instant after `now` at which the window opens or closes.
    pub fn next_change<Tz: TimeZone>(&self, now: &DateTime<Tz>) -> Option<DateTime<Utc>> {
        let t = now.with_timezone(&Utc);
        self.around(now)
            .iter()
            .flat_map(|(a, b)| [*a, *b])
            .filter(|x| *x > t)
            .min()
    }
}

/// A local wall-clock time as an instant: the first occurrence when the fall-back change repeats
/// it, the moment the clock jumps when the spring-forward change skips it.
fn resolve<Tz: TimeZone>(tz: &Tz, local: NaiveDateTime) -> DateTime<Utc> {
    use chrono::LocalResult;
    let mut t = local;
    // Gaps are at most a few hours (a zone changing its offset); search minute by minute.
    for _ in 0..(26 * 60) {
        match tz.from_local_datetime(&t) {
            LocalResult::Single(x) => return x.with_timezone(&Utc),
            LocalResult::Ambiguous(first, _) => return first.with_timezone(&Utc),
            LocalResult::None => t += Duration::minutes(1),
        }
    }
    // Not reachable for real zones; read the time as UTC rather than fail.
    Utc.from_utc_datetime(&local)
}

/// The windows of every tenant that are open at `now`, as `(tenant, index)` in file order.
pub fn open_windows<Tz: TimeZone>(
    policy: &super::Policy,
    now: &DateTime<Tz>,
) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for t in &policy.tenants {
        for (i, s) in t.schedules.iter().enumerate() {
            if s.is_open(now) {
                out.push((t.name.clone(), i));
            }
        }
    }
    out
}

/// When any window of the policy next opens or closes.
pub fn next_change<Tz: TimeZone>(
    policy: &super::Policy,
    now: &DateTime<Tz>,
) -> Option<DateTime<Utc>> {
    policy
        .tenants
        .iter()
        .flat_map(|t| t.schedules.iter())
        .filter_map(|s| s.next_change(now))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono_tz::Europe::Berlin;
    use std::path::PathBuf;
    use std::sync::Arc;

    fn sched(days: &str, from: &str, to: &str) -> Schedule {
        let days = parse_days(days).unwrap();
        let (from, to) = (
            parse_time(from, false).unwrap(),
            parse_time(to, true).unwrap(),
        );
        Schedule {
            days,
            from,
            to,
            keys: vec![],
            origin: Origin {
                file: Arc::new(PathBuf::from("t.toml")),
                line: 1,
                col: 1,
            },
            label: label(&days, from, to),
        }
    }

    fn berlin(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<chrono_tz::Tz> {
        Berlin
            .with_ymd_and_hms(y, mo, d, h, mi, 0)
            .earliest()
            .expect("a Berlin time")
    }

    #[test]
    fn days_and_times_parse() {
        assert_eq!(
            parse_days("Mon-Fri").unwrap(),
            [true, true, true, true, true, false, false]
        );
        assert_eq!(
            parse_days("fri-mon").unwrap(),
            [true, false, false, false, true, true, true]
        );
        assert_eq!(
            parse_days("Sat, Sunday").unwrap(),
            [false, false, false, false, false, true, true]
        );
        assert_eq!(parse_days("daily").unwrap(), [true; 7]);
        for bad in ["", "Mo-Fr", "Mon-", "Funday", "Mon;Tue", "../x"] {
            assert!(parse_days(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(parse_time("22:00", false), Ok(1320));
        assert_eq!(parse_time("6:05", false), Ok(365));
        assert_eq!(parse_time("24:00", true), Ok(1440));
        for bad in [
            "24:00", "22", "22:60", "25:00", "-1:00", "22:0", "ab:cd", "22:00:00",
        ] {
            assert!(parse_time(bad, false).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            days_label(&parse_days("Mon-Wed,Fri").unwrap()),
            "Mon-Wed,Fri"
        );
    }

    #[test]
    fn a_window_across_midnight_belongs_to_the_day_it_opens() {
        let s = sched("Mon-Fri", "22:00", "06:00");
        // 2026-03-06 is a Friday.
        assert!(!s.is_open(&berlin(2026, 3, 6, 21, 59)));
        assert!(s.is_open(&berlin(2026, 3, 6, 22, 0)));
        assert!(s.is_open(&berlin(2026, 3, 7, 5, 59))); // Saturday morning: Friday's window
        assert!(!s.is_open(&berlin(2026, 3, 7, 6, 0)));
        assert!(!s.is_open(&berlin(2026, 3, 7, 23, 0))); // Saturday night: no window
        assert!(!s.is_open(&berlin(2026, 3, 9, 3, 0))); // Monday 03:00: Sunday had none
        assert!(s.is_open(&berlin(2026, 3, 10, 3, 0))); // Tuesday 03:00: Monday's
                                                        // The next change after Saturday 07:00 is Monday 22:00.
        assert_eq!(
            s.next_change(&berlin(2026, 3, 7, 7, 0)),
            Some(berlin(2026, 3, 9, 22, 0).with_timezone(&Utc))
        );
        // Equal times: a whole day.
        let d = sched("Sun", "00:00", "00:00");
        assert!(d.is_open(&berlin(2026, 3, 8, 23, 59)));
        assert!(!d.is_open(&berlin(2026, 3, 9, 0, 0)));
    }

    #[test]
    fn spring_forward_opens_at_the_jump_and_keeps_its_end() {
        // 2026-03-29, Sunday: 02:00 CET becomes 03:00 CEST in Berlin.
        let s = sched("Sun", "02:30", "04:00");
        let jump = Utc.with_ymd_and_hms(2026, 3, 29, 1, 0, 0).unwrap(); // 03:00 CEST
        assert_eq!(
            s.next_change(&berlin(2026, 3, 29, 1, 0)),
            Some(jump),
            "a skipped opening time means the moment the clock jumps"
        );
        assert!(!s.is_open(&berlin(2026, 3, 29, 1, 59)));
        assert!(s.is_open(&jump.with_timezone(&Berlin)));
        assert_eq!(
            s.next_change(&jump.with_timezone(&Berlin)),
            Some(berlin(2026, 3, 29, 4, 0).with_timezone(&Utc))
        );
        // A night window across the change is one hour shorter in real time, as the clock reads.
        let n = sched("Sat", "22:00", "06:00");
        let open = berlin(2026, 3, 28, 22, 0).with_timezone(&Utc);
        let close = n.next_change(&berlin(2026, 3, 28, 22, 0)).unwrap();
        assert_eq!(close, berlin(2026, 3, 29, 6, 0).with_timezone(&Utc));
        assert_eq!(close - open, Duration::hours(7));
    }

    #[test]
    fn fall_back_closes_at_the_first_occurrence_and_never_reopens() {
        // 2026-10-25, Sunday: 03:00 CEST becomes 02:00 CET; 02:00-02:59 happens twice.
        let s = sched("Sat", "22:00", "02:30");
        let first = Utc.with_ymd_and_hms(2026, 10, 25, 0, 30, 0).unwrap(); // 02:30 CEST
        assert_eq!(s.next_change(&berlin(2026, 10, 25, 1, 0)), Some(first));
        let second_pass = Utc.with_ymd_and_hms(2026, 10, 25, 1, 15, 0).unwrap(); // 02:15 CET
        assert!(
            !s.is_open(&second_pass.with_timezone(&Berlin)),
            "the repeated hour does not reopen the window"
        );
        // A window in the repeated hour opens once, at the first 02:15.
        let r = sched("Sun", "02:15", "02:45");
        let opens = Utc.with_ymd_and_hms(2026, 10, 25, 0, 15, 0).unwrap();
        assert_eq!(r.next_change(&berlin(2026, 10, 25, 0, 0)), Some(opens));
        assert!(!r.is_open(&second_pass.with_timezone(&Berlin)));
        // The night across it is one hour longer in real time.
        let n = sched("Sat", "22:00", "06:00");
        let open = berlin(2026, 10, 24, 22, 0).with_timezone(&Utc);
        let close = n.next_change(&berlin(2026, 10, 24, 22, 0)).unwrap();
        assert_eq!(close - open, Duration::hours(9));
    }

    #[test]
    fn week_minutes_wrap_from_sunday_to_monday() {
        let s = sched("Sun", "23:00", "01:00");
        let m = s.week_minutes();
        assert!(m[6 * 1440 + 23 * 60]);
        assert!(m[30]); // Monday 00:30
        assert!(!m[60]);
        assert_eq!(m.iter().filter(|x| **x).count(), 120);
    }
}
