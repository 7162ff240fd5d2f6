//! cgrules.conf as cgrules.conf(5) describes it: one rule per line,
//!
//! ```text
//! <user>[:<process>]   <controllers>   <destination>   [<options>]
//! ```
//!
//! `<user>` is a user name, `@group`, `*` (anyone) or `%` (the previous line's user and process:
//! the same processes also go to this line's destination for these controllers). `<process>` is
//! a process name or an absolute executable path. `<controllers>` is a comma-separated list or
//! `*`; `<destination>` a group path (`%u`, `%g`, `%p` stand for the user, group and process
//! name); the only option is `ignore`. The first rule that matches a process wins.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    User(String),
    Group(String),
    Anyone,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub line: usize,
    /// The line as written (for comments in the output).
    pub text: String,
    pub who: Who,
    pub process: Option<String>,
    /// Continues the previous rule (`%`).
    pub continuation: bool,
    /// Empty: `*` (every controller).
    pub controllers: Vec<String>,
    pub destination: String,
    pub options: Vec<String>,
}

pub fn parse(text: &str) -> (Vec<Rule>, super::cgconfig::Errors) {
    let mut rules: Vec<Rule> = Vec::new();
    let mut errors = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let fields: Vec<&str> = content.split_whitespace().collect();
        if fields.len() < 3 || fields.len() > 4 {
            errors.push((
                line,
                format!(
                    "expected `<user>[:<process>] <controllers> <destination> [ignore]`, found {} field{}",
                    fields.len(),
                    if fields.len() == 1 { "" } else { "s" }
                ),
            ));
            continue;
        }
        let (user, process) = match fields[0].split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (fields[0], None),
        };
        if process == Some("") || user.is_empty() {
            errors.push((line, format!("`{}`: empty user or process name", fields[0])));
            continue;
        }
        let (who, continuation) = match user {
            "%" => match rules.last() {
                Some(prev) => (prev.who.clone(), true),
                None => {
                    errors.push((
                        line,
                        "`%` continues the previous rule, but there is none".into(),
                    ));
                    continue;
                }
            },
            "*" => (Who::Anyone, false),
            u if u.starts_with('@') && u.len() > 1 => (Who::Group(u[1..].to_string()), false),
            "@" => {
                errors.push((line, "`@` needs a group name".into()));
                continue;
            }
            u => (Who::User(u.to_string()), false),
        };
        let process = match (continuation, process) {
            (true, None) => rules.last().and_then(|r| r.process.clone()),
            (_, p) => p.map(str::to_string),
        };
        let controllers = if fields[1] == "*" {
            Vec::new()
        } else {
            let list: Vec<String> = fields[1].split(',').map(str::to_string).collect();
            if list.iter().any(|c| c.is_empty()) {
                errors.push((
                    line,
                    format!("controller list `{}` has an empty entry", fields[1]),
                ));
                continue;
            }
            list
        };
        let options: Vec<String> = fields
            .get(3)
            .map(|o| o.split(',').map(str::to_string).collect())
            .unwrap_or_default();
        if let Some(bad) = options.iter().find(|o| *o != "ignore") {
            errors.push((
                line,
                format!("unknown option `{bad}` (the only option is `ignore`)"),
            ));
            continue;
        }
        rules.push(Rule {
            line,
            text: fields.join(" "),
            who,
            process,
            continuation,
            controllers,
            destination: fields[2].to_string(),
            options,
        });
    }
    (rules, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_groups_processes_and_continuations() {
        let text = "# seed 003\noracle\t\t\tblkio\t\t\t/iothrottle\n@dba:sqlplus  cpu,memory  tools/\n%  blkio  io/%u\n*:/usr/bin/rman * backup ignore\n";
        let (rules, errors) = parse(text);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(rules.len(), 4);
        assert_eq!(rules[0].who, Who::User("oracle".into()));
        assert_eq!(rules[0].controllers, ["blkio"]);
        assert_eq!(rules[0].destination, "/iothrottle");
        assert_eq!(rules[1].who, Who::Group("dba".into()));
        assert_eq!(rules[1].process.as_deref(), Some("sqlplus"));
        assert!(rules[2].continuation);
        assert_eq!(rules[2].who, Who::Group("dba".into()));
        assert_eq!(rules[2].process.as_deref(), Some("sqlplus"));
        assert_eq!(rules[3].who, Who::Anyone);
        assert!(rules[3].controllers.is_empty());
        assert_eq!(rules[3].options, ["ignore"]);
        assert_eq!(rules[3].line, 5);
    }

    #[test]
    fn bad_lines_are_reported_with_their_numbers() {
        let text = "% blkio /a\noracle blkio\noracle blkio /a later\n@ cpu /b\noracle cpu,,memory /c\nok cpu /d\n";
        let (rules, errors) = parse(text);
        let lines: Vec<usize> = errors.iter().map(|e| e.0).collect();
        assert_eq!(lines, [1, 2, 3, 4, 5], "{errors:?}");
        assert_eq!(rules.len(), 1);
    }
}
