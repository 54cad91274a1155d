//! Rust source read as tokens, enough for the checks that read the code
//! as text (`layers`, `sizes`, the image's programs): identifiers, `::`
//! and single punctuation, each with its line, and no comment or
//! character literal, so that a path or a brace in prose or in a message
//! is not code. String literals are left out too, or kept as one token
//! each (for the checks that want a literal's value).

pub(crate) fn is_ident(word: &str) -> bool {
    word.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Identifiers, `::` and single punctuation, with their line; comments,
/// strings and character literals are left out.
pub(crate) fn tokens(text: &str) -> Vec<(usize, String)> {
    scan(text, false)
}

/// As [`tokens`], with each string literal kept as one token: its text
/// (escapes left as written) after a `"`, so that no identifier or
/// punctuation reads as one. [`literal`] gives the text back.
pub(crate) fn tokens_with_strings(text: &str) -> Vec<(usize, String)> {
    scan(text, true)
}

/// The text of a string literal's token, `None` for any other token.
pub(crate) fn literal(token: &str) -> Option<&str> {
    token.strip_prefix('"')
}

fn scan(text: &str, keep_strings: bool) -> Vec<(usize, String)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            let mut nested = 1;
            while i < chars.len() && nested > 0 {
                if chars[i] == '\n' {
                    line += 1;
                }
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    nested += 1;
                    i += 1;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    nested -= 1;
                    i += 1;
                }
                i += 1;
            }
        } else if c == '"'
            || (c == 'r' && matches!(next, Some('"') | Some('#')))
            || (c == 'b' && matches!(next, Some('"') | Some('r')))
        {
            let (start, first_line) = (i, line);
            i = skip_string(&chars, if c == 'b' { i + 1 } else { i }, &mut line);
            let written: String = chars[start..i].iter().collect();
            if keep_strings && written.contains('"') {
                out.push((first_line, format!("\"{}", literal_text(&written))));
            }
        } else if c == '\'' {
            i = skip_char_literal(&chars, i);
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push((line, chars[start..i].iter().collect()));
        } else if c == ':' && next == Some(':') {
            out.push((line, "::".to_string()));
            i += 2;
        } else {
            out.push((line, c.to_string()));
            i += 1;
        }
    }
    out
}

/// The index of the bracket that closes the `{`, `(` or `[` at `open`.
pub(crate) fn closing(tokens: &[(usize, String)], open: usize) -> Option<usize> {
    let opener = tokens.get(open)?.1.as_str();
    let closer = match opener {
        "{" => "}",
        "(" => ")",
        "[" => "]",
        _ => return None,
    };
    let mut depth = 0usize;
    for (i, (_, t)) in tokens.iter().enumerate().skip(open) {
        if t == opener {
            depth += 1;
        } else if t == closer {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

/// The first and last line of each `#[cfg(test)] mod name { … }`.
pub(crate) fn test_blocks(tokens: &[(usize, String)]) -> Vec<(usize, usize)> {
    const CFG_TEST: [&str; 7] = ["#", "[", "cfg", "(", "test", ")", "]"];
    let mut blocks = Vec::new();
    let mut i = 0;
    while i + CFG_TEST.len() + 2 < tokens.len() {
        let is_cfg_test = CFG_TEST
            .iter()
            .enumerate()
            .all(|(k, want)| tokens[i + k].1 == *want);
        let mut after = i + CFG_TEST.len();
        // `pub mod tests`, `pub(crate) mod tests`: the visibility first.
        if tokens[after].1 == "pub" {
            after += 1;
            if tokens.get(after).is_some_and(|t| t.1 == "(") {
                after += 3;
            }
        }
        let opens = tokens.get(after).is_some_and(|t| t.1 == "mod")
            && tokens.get(after + 2).is_some_and(|t| t.1 == "{");
        if is_cfg_test && opens {
            if let Some(end) = closing(tokens, after + 2) {
                blocks.push((tokens[i].0, tokens[end].0));
                i = end;
                continue;
            }
        }
        i += 1;
    }
    blocks
}

/// What is between the quotes of `"…"`, `r#"…"#` or `b"…"`.
fn literal_text(written: &str) -> &str {
    let open = written.find('"').map_or(0, |q| q + 1);
    let close = written.rfind('"').unwrap_or(written.len());
    &written[open.min(close)..close]
}

/// Past a `"…"`, `r"…"` or `r#"…"#` literal starting at `i`.
fn skip_string(chars: &[char], mut i: usize, line: &mut usize) -> usize {
    if chars[i] == 'r' {
        let mut hashes = 0;
        i += 1;
        while chars.get(i) == Some(&'#') {
            hashes += 1;
            i += 1;
        }
        if chars.get(i) != Some(&'"') {
            // `r#ident` (a raw identifier), not a string.
            return i;
        }
        i += 1;
        while i < chars.len() {
            if chars[i] == '\n' {
                *line += 1;
            }
            if chars[i] == '"' && (1..=hashes).all(|h| chars.get(i + h) == Some(&'#')) {
                return i + 1 + hashes;
            }
            i += 1;
        }
        return i;
    }
    i += 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            '\n' => *line += 1,
            '"' => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Past a `'x'` or `'\n'` literal; a lifetime (`'a`) is just its quote.
fn skip_char_literal(chars: &[char], i: usize) -> usize {
    if chars.get(i + 1) == Some(&'\\') {
        let mut j = i + 2;
        while j < chars.len() && chars[j] != '\'' {
            j += 1;
        }
        return j + 1;
    }
    if chars.get(i + 2) == Some(&'\'') {
        return i + 3;
    }
    i + 1
}

/// Which inline `mod name { … }` blocks a token walk is inside, fed one
/// token at a time: `super::` inside one climbs to the file's own module
/// first.
/// The paths of the `use` tree at `toks[at]`, each with its `as` name;
/// returns the index past the tree's `;` (or its closing `}` / `,`).
pub(crate) fn use_tree(
    toks: &[(usize, String)],
    mut at: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    let mut alias = None;
    while let Some((_, t)) = toks.get(at) {
        match t.as_str() {
            "::" => {}
            "{" => {
                at += 1;
                while toks.get(at).is_some_and(|t| t.1 != "}") {
                    at = use_tree(toks, at, prefix.clone(), out);
                    if toks.get(at).is_some_and(|t| t.1 == ",") {
                        at += 1;
                    }
                }
                // Past the group's `}`; the caller's tree ends here.
                return finish(toks, at + 1);
            }
            "as" => {
                alias = toks.get(at + 1).map(|t| t.1.clone());
                at += 1;
            }
            "," | "}" | ";" => break,
            "self" if !prefix.is_empty() => {}
            word => prefix.push(word.to_string()),
        }
        at += 1;
    }
    if !prefix.is_empty() {
        out.push((prefix, alias));
    }
    if toks.get(at).is_some_and(|t| t.1 == ";") {
        at += 1;
    }
    at
}

/// After a group: past the statement's `;`, or at the `,`/`}` that ends
/// the enclosing group's member.
fn finish(toks: &[(usize, String)], at: usize) -> usize {
    if toks.get(at).is_some_and(|t| t.1 == ";") {
        at + 1
    } else {
        at
    }
}

#[derive(Default)]
pub(crate) struct InlineModules {
    /// The brace depth each open block started at.
    opened_at: Vec<usize>,
    depth: usize,
}

impl InlineModules {
    /// Takes `tokens[i]` into account.
    pub(crate) fn step(&mut self, tokens: &[(usize, String)], i: usize) {
        match tokens[i].1.as_str() {
            "{" => self.depth += 1,
            "}" => {
                self.depth = self.depth.saturating_sub(1);
                if self.opened_at.last() == Some(&self.depth) {
                    self.opened_at.pop();
                }
            }
            "mod" if tokens.get(i + 2).is_some_and(|t| t.1 == "{") => {
                self.opened_at.push(self.depth)
            }
            _ => {}
        }
    }

    /// How many inline modules the walk is inside.
    pub(crate) fn len(&self) -> usize {
        self.opened_at.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.opened_at.is_empty()
    }
}
