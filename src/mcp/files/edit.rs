//! `edit_file`: exact text replacements, all or nothing. The file is read
//! whole (one version of it), every edit is applied in order to the text
//! in memory and checked against its expected count, and only when all
//! match is the result written, atomically and only over the version that
//! was read: a file changed meanwhile is a conflict, not lost work.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::content::{version_bytes, version_text};
use super::{EDIT_DIFF_BYTES, EDIT_MAX_BYTES, EDIT_MAX_EDITS, FileToolError, FileTools};
use crate::model::{RefusalKind, WriteOptions};

/// One replacement.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    /// The exact text to replace (not empty; whitespace and line ends
    /// count).
    pub old_text: String,
    /// What replaces it.
    pub new_text: String,
    /// How many times `old_text` must occur (counted without overlaps,
    /// in the text as the edits before this one left it); every
    /// occurrence is replaced. Default 1.
    #[serde(default)]
    pub expected_count: Option<u64>,
}

/// Arguments of `edit_file`.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditFileArgs {
    /// The file (UTF-8 text): relative to the root, or absolute beneath it.
    pub path: String,
    /// The replacements, applied in order.
    pub edits: Vec<Edit>,
    /// Edit only if the file is at this version (from read_file,
    /// write_file or edit_file).
    #[serde(default)]
    pub if_version: Option<String>,
}

/// What `edit_file` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct EditFileResult {
    /// The file, relative to the root.
    pub path: String,
    /// The edited content's version.
    pub version: String,
    /// The edited file's size in bytes.
    pub size: u64,
    /// Occurrences replaced, all edits together.
    pub replacements: u64,
    /// The changes, one hunk per occurrence: "@@ edit N, line L @@" (the
    /// line where it began in the text that edit saw), then the old
    /// lines with "-" and the new with "+". At most 8 KiB.
    pub diff: String,
    /// Whether `diff` was cut at its 8 KiB.
    pub diff_truncated: bool,
}

impl FileTools {
    pub async fn edit_file(&self, args: EditFileArgs) -> Result<EditFileResult, FileToolError> {
        let named = self.place("path", &args.path)?;
        check_edits(&args.edits)?;
        let file = self.followed(&named).await?;
        let wanted = match &args.if_version {
            Some(text) => Some(version_bytes("if_version", text)?),
            None => None,
        };
        let (data, stat) = self.read_whole(&file, EDIT_MAX_BYTES, "edit_file").await?;
        if let Some(wanted) = &wanted
            && *wanted != stat.version
        {
            return Err(self
                .conflict(
                    &file,
                    &format!(
                        "not edited: it is not at version {}",
                        args.if_version.as_deref().unwrap_or_default()
                    ),
                )
                .await);
        }
        let text = String::from_utf8(data).map_err(|error| {
            FileToolError::failed(format!(
                "capexec: {:?} is not UTF-8 text (byte {} is not), so it cannot be edited as \
                 text: write it whole with write_file",
                file.shown(),
                error.utf8_error().valid_up_to()
            ))
        })?;
        let applied = apply(text, &args.edits).map_err(FileToolError::failed)?;
        let options = WriteOptions {
            // Only over what was read: a change since is a conflict.
            if_version: stat.version.clone(),
            ..WriteOptions::default()
        };
        match self
            .directory
            .write_with(&file.relative, applied.text.as_bytes(), &options)
            .await
        {
            Ok(written) => Ok(EditFileResult {
                path: named.shown(),
                version: version_text(&written),
                size: written.size,
                replacements: applied.replacements,
                diff: applied.diff,
                diff_truncated: applied.diff_truncated,
            }),
            Err(error) if error.refusal_kind() == Some(RefusalKind::Conflict) => Err(self
                .conflict(
                    &file,
                    &format!(
                        "not edited: it changed while it was edited (it was at version {})",
                        version_text(&stat)
                    ),
                )
                .await),
            Err(error) => Err(FileToolError::from_client(error)),
        }
    }
}

fn check_edits(edits: &[Edit]) -> Result<(), FileToolError> {
    if edits.is_empty() {
        return Err(FileToolError::invalid(
            "`edits` is empty: give at least one",
        ));
    }
    if edits.len() > EDIT_MAX_EDITS {
        return Err(FileToolError::invalid(format!(
            "{} edits; one edit_file applies at most {EDIT_MAX_EDITS}",
            edits.len()
        )));
    }
    for (index, edit) in edits.iter().enumerate() {
        if edit.old_text.is_empty() {
            return Err(FileToolError::invalid(format!(
                "edit {} of {}: `old_text` is empty",
                index + 1,
                edits.len()
            )));
        }
        if edit.expected_count == Some(0) {
            return Err(FileToolError::invalid(format!(
                "edit {} of {}: `expected_count` is 0 (an edit must replace something)",
                index + 1,
                edits.len()
            )));
        }
    }
    Ok(())
}

/// The text with every edit applied, or why not (nothing applied).
struct Applied {
    text: String,
    replacements: u64,
    diff: String,
    diff_truncated: bool,
}

fn apply(mut text: String, edits: &[Edit]) -> Result<Applied, String> {
    let mut replacements = 0;
    let mut diff = Diff::default();
    for (index, edit) in edits.iter().enumerate() {
        let number = index + 1;
        let expected = edit.expected_count.unwrap_or(1);
        // Counted first, without keeping positions: a short old_text may
        // occur millions of times.
        let found = text.matches(edit.old_text.as_str()).count() as u64;
        if found != expected {
            let hint = if found > expected {
                " (give more of the surrounding text in old_text to tell them apart, or set \
                 expected_count)"
            } else if found == 0 {
                " (old_text must match the file exactly, whitespace and line ends included)"
            } else {
                ""
            };
            return Err(format!(
                "capexec: edit {number} of {}: old_text was found {} {}, expected {expected}{hint}; \
                 nothing was changed",
                edits.len(),
                found,
                if found == 1 { "time" } else { "times" }
            ));
        }
        let grown = text.len() as i128
            + found as i128 * (edit.new_text.len() as i128 - edit.old_text.len() as i128);
        if grown > EDIT_MAX_BYTES as i128 {
            return Err(format!(
                "capexec: edit {number} of {}: the file would grow to {grown} bytes, past the \
                 {EDIT_MAX_BYTES} edit_file edits; nothing was changed",
                edits.len()
            ));
        }
        // Lines counted onwards from the occurrence before, while the
        // summary has room.
        let (mut line, mut counted) = (1, 0);
        for (at, _) in text.match_indices(edit.old_text.as_str()) {
            if diff.truncated {
                break;
            }
            line += text[counted..at]
                .bytes()
                .filter(|&byte| byte == b'\n')
                .count();
            counted = at;
            diff.hunk(number, line, &edit.old_text, &edit.new_text);
        }
        text = text.replace(edit.old_text.as_str(), &edit.new_text);
        replacements += found;
    }
    Ok(Applied {
        text,
        replacements,
        diff: diff.text,
        diff_truncated: diff.truncated,
    })
}

/// The summary of changes, bounded.
#[derive(Default)]
struct Diff {
    text: String,
    truncated: bool,
}

impl Diff {
    fn hunk(&mut self, edit: usize, line: usize, old: &str, new: &str) {
        if self.truncated {
            return;
        }
        let mut hunk = format!("@@ edit {edit}, line {line} @@\n");
        for old_line in old.split_inclusive('\n') {
            hunk.push('-');
            hunk.push_str(old_line);
        }
        if !hunk.ends_with('\n') {
            hunk.push('\n');
        }
        for new_line in new.split_inclusive('\n') {
            hunk.push('+');
            hunk.push_str(new_line);
        }
        if !hunk.ends_with('\n') {
            hunk.push('\n');
        }
        if self.text.len() + hunk.len() > EDIT_DIFF_BYTES {
            self.truncated = true;
            return;
        }
        self.text.push_str(&hunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(old: &str, new: &str, count: Option<u64>) -> Edit {
        Edit {
            old_text: old.into(),
            new_text: new.into(),
            expected_count: count,
        }
    }

    #[test]
    fn edits_apply_in_order_each_to_what_the_one_before_left() {
        let applied = apply(
            "a = 1\nb = 1\n".into(),
            &[edit("= 1", "= 2", Some(2)), edit("b = 2", "b = 3", None)],
        )
        .expect("applies");
        assert_eq!(applied.text, "a = 2\nb = 3\n");
        assert_eq!(applied.replacements, 3);
        assert_eq!(
            applied.diff,
            "@@ edit 1, line 1 @@\n-= 1\n+= 2\n@@ edit 1, line 2 @@\n-= 1\n+= 2\n\
             @@ edit 2, line 2 @@\n-b = 2\n+b = 3\n"
        );
        assert!(!applied.diff_truncated);
    }

    #[test]
    fn a_count_that_does_not_match_refuses_every_edit_naming_the_one() {
        let error = apply(
            "x x x".into(),
            &[edit("x", "y", Some(3)), edit("x", "z", None)],
        )
        .err()
        .expect("refused");
        assert_eq!(
            error,
            "capexec: edit 2 of 2: old_text was found 0 times, expected 1 (old_text must match \
             the file exactly, whitespace and line ends included); nothing was changed"
        );
        let error = apply("x x".into(), &[edit("x", "y", None)])
            .err()
            .expect("refused");
        assert!(
            error.starts_with("capexec: edit 1 of 1: old_text was found 2 times, expected 1"),
            "{error}"
        );
    }

    #[test]
    fn the_diff_is_bounded() {
        let text = "line\n".repeat(5000);
        let applied = apply(text, &[edit("line", "LINE", Some(5000))]).expect("applies");
        assert!(applied.diff_truncated);
        assert!(applied.diff.len() <= EDIT_DIFF_BYTES);
        assert_eq!(applied.text, "LINE\n".repeat(5000));
    }

    #[test]
    fn bad_edits_are_the_arguments_fault() {
        assert_eq!(
            check_edits(&[]).expect_err("empty").message,
            "`edits` is empty: give at least one"
        );
        assert_eq!(
            check_edits(&[edit("a", "b", None), edit("", "b", None)])
                .expect_err("empty old")
                .message,
            "edit 2 of 2: `old_text` is empty"
        );
    }
}
