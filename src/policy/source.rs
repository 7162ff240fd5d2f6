//! Where a policy value came from: file, line and column. Every value that validation can reject
//! carries its origin, so an error names the place a user has to edit.

use std::cell::Cell;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Deserializer};

/// The policy files read, in merge order, with where their lines start (to turn byte spans into
/// lines).
#[derive(Debug, Default, Clone)]
pub struct SourceMap {
    /// Each file's path, the byte offsets where its lines start and its length (found once: a
    /// policy of a thousand tenants has thousands of located values, and counting newlines from
    /// the top for each took seconds).
    files: Vec<(Arc<PathBuf>, Vec<usize>, usize)>,
    /// Files whose text dbcage wrote (a `dbcage set` request): their lines mean nothing to a
    /// user, so their origins name only the file (`dbcage set pg15`).
    unlocated: Vec<usize>,
}

impl SourceMap {
    pub fn add(&mut self, path: &Path, text: &str) -> usize {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        self.files
            .push((Arc::new(path.to_path_buf()), line_starts, text.len()));
        self.files.len() - 1
    }

    /// Adds text that is not a file the user wrote (see `unlocated`).
    pub fn add_unlocated(&mut self, name: &Path, text: &str) -> usize {
        let i = self.add(name, text);
        self.unlocated.push(i);
        i
    }

    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(p, _, _)| p.as_path())
    }

    pub fn origin(&self, file: usize, span: &Range<usize>) -> Origin {
        let (path, line_starts, len) = &self.files[file];
        let (line, col) = if self.unlocated.contains(&file) {
            (0, 0)
        } else {
            // The last line start at or before the offset; as in `line_col`, an offset past
            // the end is the end.
            let offset = span.start.min(*len);
            let line = line_starts.partition_point(|&s| s <= offset);
            (line, offset - line_starts[line - 1] + 1)
        };
        Origin {
            file: path.clone(),
            line,
            col,
        }
    }
}

/// 1-based line and column of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rfind('\n')
        .map(|nl| offset - nl)
        .unwrap_or(offset + 1);
    (line, col)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub file: Arc<PathBuf>,
    /// 1-based; 0 when the text is not a file the user wrote (see `SourceMap::add_unlocated`).
    pub line: usize,
    pub col: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            return write!(f, "{}", self.file.display());
        }
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.col)
    }
}

/// A validated value and where it was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Sourced<T> {
    pub value: T,
    pub origin: Origin,
}

thread_local! {
    /// The index (in the SourceMap) of the file being deserialized right now. `Loc` reads it so
    /// that values from different drop-ins keep their own file after merging.
    static CURRENT_FILE: Cell<usize> = const { Cell::new(0) };
}

pub(crate) fn with_current_file<R>(file: usize, f: impl FnOnce() -> R) -> R {
    let previous = CURRENT_FILE.with(|c| c.replace(file));
    let result = f();
    CURRENT_FILE.with(|c| c.set(previous));
    result
}

/// A raw value with its byte span and file, as deserialized.
#[derive(Debug, Clone)]
pub struct Loc<T> {
    pub value: T,
    pub file: usize,
    pub span: Range<usize>,
}

impl<T> Loc<T> {
    /// Another value at this value's place: what a preset adds is located at its `preset` key.
    pub fn here<U>(&self, value: U) -> Loc<U> {
        Loc {
            value,
            file: self.file,
            span: self.span.clone(),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Loc<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let spanned = serde_spanned::Spanned::<T>::deserialize(d)?;
        let span = spanned.span();
        Ok(Loc {
            value: spanned.into_inner(),
            file: CURRENT_FILE.with(|c| c.get()),
            span,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based() {
        let text = "a = 1\nbb = 2\n";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 6), (2, 1));
        assert_eq!(line_col(text, 11), (2, 6));
    }

    #[test]
    fn the_source_map_locates_every_offset_as_line_col_does() {
        let text = "a = 1\n\nbb = 2\nlast";
        let mut map = SourceMap::default();
        let file = map.add(Path::new("p.toml"), text);
        for offset in 0..text.len() + 3 {
            let o = map.origin(file, &(offset..offset + 1));
            assert_eq!((o.line, o.col), line_col(text, offset), "offset {offset}");
        }
    }
}
