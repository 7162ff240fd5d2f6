//! cgconfig.conf as cgconfig.conf(5) describes it:
//!
//! ```text
//! mount { <controller>[,<controller>] = <path>; ... }
//! group <name> {
//!     [perm { task { uid = U; gid = G; [fperm = M;] } admin { uid = U; gid = G; [dperm = M;] [fperm = M;] } }]
//!     <controller> { <parameter> = <value>; ... }
//!     ...
//! }
//! default { perm { ... } }
//! template <name> { ... }          (groups created on demand by cgred, %u %g %p in the name)
//! namespace { <controller> = <path>; ... }
//! ```
//!
//! Names and values are bare words or double-quoted strings (`"8:16 10"`); `#` starts a comment.
//! Parsing never stops at the first problem: an error skips to the end of its top-level block
//! and the next block is read, so one run reports every bad line.

/// One `key = value;` with the line it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    pub key: String,
    pub value: String,
    pub line: usize,
}

/// A `{ ... }` block inside a group: a controller's parameters, or `perm`'s `task`/`admin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub name: String,
    pub line: usize,
    pub params: Vec<Param>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Group {
    pub name: String,
    pub line: usize,
    /// `task` and `admin` of `perm`.
    pub perm: Vec<Block>,
    pub controllers: Vec<Block>,
}

/// A top-level block, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Mount {
        line: usize,
        params: Vec<Param>,
    },
    Namespace {
        line: usize,
        params: Vec<Param>,
    },
    Group(Group),
    /// `default` (name empty) and `template <name>`: kept for the notes.
    Other {
        kind: String,
        name: String,
        line: usize,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Open,
    Close,
    Eq,
    Semi,
    Word(String),
}

impl Tok {
    fn shown(&self) -> String {
        match self {
            Tok::Open => "`{`".into(),
            Tok::Close => "`}`".into(),
            Tok::Eq => "`=`".into(),
            Tok::Semi => "`;`".into(),
            Tok::Word(w) => format!("`{w}`"),
        }
    }
}

/// (line, message) of every problem.
pub type Errors = Vec<(usize, String)>;

fn lex(text: &str, errors: &mut Errors) -> Vec<(usize, Tok)> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let mut chars = raw.chars().peekable();
        while let Some(&c) = chars.peek() {
            match c {
                '#' => break,
                c if c.is_whitespace() => {
                    chars.next();
                }
                '{' | '}' | '=' | ';' => {
                    chars.next();
                    out.push((
                        line,
                        match c {
                            '{' => Tok::Open,
                            '}' => Tok::Close,
                            '=' => Tok::Eq,
                            _ => Tok::Semi,
                        },
                    ));
                }
                '"' => {
                    chars.next();
                    let mut s = String::new();
                    let mut closed = false;
                    for c in chars.by_ref() {
                        if c == '"' {
                            closed = true;
                            break;
                        }
                        s.push(c);
                    }
                    if !closed {
                        errors.push((line, "unterminated quoted string".into()));
                    }
                    out.push((line, Tok::Word(s)));
                }
                _ => {
                    let mut s = String::new();
                    while let Some(&c) = chars.peek() {
                        if c.is_whitespace() || matches!(c, '{' | '}' | '=' | ';' | '"' | '#') {
                            break;
                        }
                        s.push(c);
                        chars.next();
                    }
                    out.push((line, Tok::Word(s)));
                }
            }
        }
    }
    out
}

struct Parser {
    toks: Vec<(usize, Tok)>,
    pos: usize,
    last_line: usize,
}

type Res<T> = Result<T, (usize, String)>;

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(_, t)| t)
    }
    fn line(&self) -> usize {
        self.toks
            .get(self.pos)
            .map(|(l, _)| *l)
            .unwrap_or(self.last_line)
    }
    fn next(&mut self, what: &str) -> Res<(usize, Tok)> {
        match self.toks.get(self.pos) {
            Some(t) => {
                self.pos += 1;
                Ok(t.clone())
            }
            None => Err((
                self.last_line,
                format!("unexpected end of file: expected {what}"),
            )),
        }
    }
    fn expect(&mut self, want: Tok, what: &str) -> Res<usize> {
        let (line, t) = self.next(what)?;
        if t == want {
            Ok(line)
        } else {
            Err((line, format!("expected {what}, found {}", t.shown())))
        }
    }
    fn word(&mut self, what: &str) -> Res<(usize, String)> {
        match self.next(what)? {
            (line, Tok::Word(w)) => Ok((line, w)),
            (line, t) => Err((line, format!("expected {what}, found {}", t.shown()))),
        }
    }

    /// `key = value;` pairs up to the closing `}` (consumed).
    fn params(&mut self, block: &str) -> Res<Vec<Param>> {
        let mut out = Vec::new();
        loop {
            if self.peek() == Some(&Tok::Close) {
                self.pos += 1;
                return Ok(out);
            }
            let (line, key) = self.word(&format!("a parameter name or `}}` in `{block}`"))?;
            self.expect(Tok::Eq, &format!("`=` after `{key}`"))?;
            let (_, value) = self.word(&format!("a value for `{key}`"))?;
            // libcgroup accepts a missing `;` before `}`; so does this.
            match self.peek() {
                Some(Tok::Semi) => self.pos += 1,
                Some(Tok::Close) => {}
                _ => {
                    let l = self.line();
                    let found = self.peek().map(Tok::shown).unwrap_or("end of file".into());
                    return Err((
                        l,
                        format!("expected `;` after `{key} = {value}`, found {found}"),
                    ));
                }
            }
            out.push(Param { key, value, line });
        }
    }

    fn group_body(&mut self, g: &mut Group) -> Res<()> {
        loop {
            if self.peek() == Some(&Tok::Close) {
                self.pos += 1;
                return Ok(());
            }
            let (line, name) = self.word("a controller, `perm` or `}` in a group")?;
            self.expect(Tok::Open, &format!("`{{` after `{name}`"))?;
            if name == "perm" {
                loop {
                    if self.peek() == Some(&Tok::Close) {
                        self.pos += 1;
                        break;
                    }
                    let (line, which) = self.word("`task`, `admin` or `}` in `perm`")?;
                    if which != "task" && which != "admin" {
                        return Err((
                            line,
                            format!("`perm` holds `task` and `admin` blocks, not `{which}`"),
                        ));
                    }
                    self.expect(Tok::Open, &format!("`{{` after `{which}`"))?;
                    let params = self.params(&which)?;
                    g.perm.push(Block {
                        name: which,
                        line,
                        params,
                    });
                }
            } else {
                let params = self.params(&name)?;
                g.controllers.push(Block { name, line, params });
            }
        }
    }

    fn item(&mut self) -> Res<Item> {
        let (line, kw) = self.word("`mount`, `group`, `default`, `template` or `namespace`")?;
        match kw.as_str() {
            "mount" | "namespace" => {
                self.expect(Tok::Open, &format!("`{{` after `{kw}`"))?;
                let params = self.params(&kw)?;
                Ok(if kw == "mount" {
                    Item::Mount { line, params }
                } else {
                    Item::Namespace { line, params }
                })
            }
            "group" | "template" => {
                let (_, name) = self.word(&format!("a name after `{kw}`"))?;
                self.expect(Tok::Open, &format!("`{{` after `{kw} {name}`"))?;
                let mut g = Group {
                    name: name.clone(),
                    line,
                    ..Default::default()
                };
                self.group_body(&mut g)?;
                Ok(if kw == "group" {
                    Item::Group(g)
                } else {
                    Item::Other {
                        kind: kw,
                        name,
                        line,
                    }
                })
            }
            "default" => {
                self.expect(Tok::Open, "`{` after `default`")?;
                let mut g = Group::default();
                self.group_body(&mut g)?;
                Ok(Item::Other {
                    kind: kw,
                    name: String::new(),
                    line,
                })
            }
            other => Err((
                line,
                format!("unknown block `{other}`: expected `mount`, `group`, `default`, `template` or `namespace`"),
            )),
        }
    }

    /// After an error: skip to the end of the top-level block the error is in.
    fn recover(&mut self, start: usize) {
        // A stray `}` is skipped alone; otherwise re-scan from the block's start, counting
        // braces, to its matching `}`.
        if self.toks.get(start).map(|t| &t.1) == Some(&Tok::Close) {
            self.pos = start + 1;
            return;
        }
        let mut depth = 0i32;
        let mut i = start;
        let mut seen_open = false;
        while i < self.toks.len() {
            match self.toks[i].1 {
                Tok::Open => {
                    depth += 1;
                    seen_open = true;
                }
                Tok::Close => {
                    depth -= 1;
                    if seen_open && depth <= 0 {
                        self.pos = i + 1;
                        return;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        self.pos = self.toks.len().max(start + 1);
    }
}

/// Parses the whole file: the blocks read, and every problem (line, message).
pub fn parse(text: &str) -> (Vec<Item>, Errors) {
    let mut errors = Vec::new();
    let toks = lex(text, &mut errors);
    let last_line = text.lines().count().max(1);
    let mut p = Parser {
        toks,
        pos: 0,
        last_line,
    };
    let mut items = Vec::new();
    while p.pos < p.toks.len() {
        let start = p.pos;
        match p.item() {
            Ok(i) => items.push(i),
            Err(e) => {
                errors.push(e);
                p.recover(start);
            }
        }
    }
    errors.sort_by_key(|e| e.0);
    (items, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_perm_and_controllers_are_read() {
        let text = "# c\nmount {\n  cpuset = /cgroup/cpuset;\n  \"cpu,cpuacct\" = /cgroup/cpu;\n}\ngroup db/a {\n perm { task { uid = oracle; gid = dba; } admin { uid = root; gid = root; } }\n cpuset { cpuset.cpus=0-31; cpuset.mems = \"0-3\" }\n blkio {\n  blkio.throttle.read_iops_device=\"8:16 10\";\n }\n}\n";
        let (items, errors) = parse(text);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(items.len(), 2);
        let Item::Mount { params, .. } = &items[0] else {
            panic!("{items:?}")
        };
        assert_eq!(params[1].key, "cpu,cpuacct");
        let Item::Group(g) = &items[1] else {
            panic!("{items:?}")
        };
        assert_eq!((g.name.as_str(), g.line), ("db/a", 6));
        assert_eq!(g.perm.len(), 2);
        assert_eq!(g.perm[0].params[0].value, "oracle");
        assert_eq!(g.controllers[0].params[1].value, "0-3");
        assert_eq!(g.controllers[1].params[0].value, "8:16 10");
        assert_eq!(g.controllers[1].params[0].line, 10);
    }

    #[test]
    fn every_bad_block_is_reported_with_its_line_and_parsing_goes_on() {
        let text = "group a {\n cpu {\n  cpu.shares 512;\n }\n}\nbogus {\n}\ngroup b {\n memory { memory.limit_in_bytes = 1G; }\n}\ngroup c {\n cpu { cpu.shares = \"5\n";
        let (items, errors) = parse(text);
        let lines: Vec<usize> = errors.iter().map(|e| e.0).collect();
        assert_eq!(lines, [3, 6, 12, 12], "{errors:?}");
        assert!(
            errors[0].1.contains("expected `=` after `cpu.shares`"),
            "{errors:?}"
        );
        assert!(errors[1].1.contains("unknown block `bogus`"), "{errors:?}");
        assert!(items
            .iter()
            .any(|i| matches!(i, Item::Group(g) if g.name == "b")));
    }
}
