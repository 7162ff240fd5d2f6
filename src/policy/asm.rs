//! The text of an ASM storage entry (`asm:<diskgroup>:<diskstring>`): its parse and the check
//! of a listed disk against the diskstring. Running asmcmd is `inventory::asm`.

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AsmSpec {
    pub diskgroup: String,
    /// The discovery globs: absolute paths, or `ORCL:` / `AFD:` label globs.
    pub diskstring: Vec<String>,
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 30
        && n.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '#'))
}

impl AsmSpec {
    /// `DATA:/dev/oracleasm/disks/*` (the text after `asm:`).
    pub fn parse(spec: &str) -> Result<AsmSpec, String> {
        let (group, diskstring) = spec
            .split_once(':')
            .ok_or_else(|| format!("ASM storage `{spec}` must be `<diskgroup>:<diskstring>`"))?;
        if !valid_name(group) {
            return Err(format!(
                "`{group}` is not an ASM diskgroup name (a letter, then letters, digits, `_`, `$` or `#`; at most 30)"
            ));
        }
        let mut globs = Vec::new();
        for g in diskstring.split(',').map(str::trim) {
            let ok = if let Some(label) = g.strip_prefix("ORCL:").or(g.strip_prefix("AFD:")) {
                !label.is_empty() && !label.contains('/')
            } else {
                g.starts_with('/') && !g.split('/').any(|c| c == "..")
            };
            if !ok || glob::Pattern::new(g).is_err() {
                return Err(format!(
                    "asm_diskstring entry `{g}` must be an absolute path glob without `..`, or `ORCL:<glob>` / `AFD:<glob>`"
                ));
            }
            globs.push(g.to_string());
        }
        Ok(AsmSpec {
            diskgroup: group.to_string(),
            diskstring: globs,
        })
    }

    /// The device path of a disk as `lsdsk` names it, checked against the diskstring.
    pub fn disk_path(&self, disk: &str) -> Result<String, String> {
        let path = if let Some(label) = disk.strip_prefix("ORCL:") {
            format!("/dev/oracleasm/disks/{label}")
        } else if let Some(label) = disk.strip_prefix("AFD:") {
            format!("/dev/oracleafd/disks/{label}")
        } else {
            disk.to_string()
        };
        if !path.starts_with('/') || path.split('/').any(|c| c == ".." || c == ".") {
            return Err(format!(
                "asmcmd lists disk `{disk}`, which is not a device path or an ORCL:/AFD: label"
            ));
        }
        let covered = self.diskstring.iter().any(|g| {
            glob::Pattern::new(g).is_ok_and(|p| {
                p.matches_with(
                    disk,
                    glob::MatchOptions {
                        require_literal_separator: true,
                        ..Default::default()
                    },
                )
            })
        });
        if !covered {
            return Err(format!(
                "asmcmd lists disk `{disk}` in diskgroup {}, but asm_diskstring `{}` does not match it",
                self.diskgroup,
                self.diskstring.join(",")
            ));
        }
        Ok(path)
    }
}
