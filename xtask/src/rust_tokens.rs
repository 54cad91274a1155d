//! Rust source read as tokens, enough for the checks that read the code
//! as text (`layers`, `sizes`): identifiers, `::` and single punctuation,
//! each with its line, and no comment, string or character literal, so
//! that a path or a brace in prose or in a message is not code.

pub(crate) fn is_ident(word: &str) -> bool {
    word.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Identifiers, `::` and single punctuation, with their line; comments,
/// strings and character literals are left out.
pub(crate) fn tokens(text: &str) -> Vec<(usize, String)> {
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
        } else if c == '"' || (c == 'r' && matches!(next, Some('"') | Some('#'))) {
            i = skip_string(&chars, i, &mut line);
        } else if c == 'b' && matches!(next, Some('"') | Some('r')) {
            i = skip_string(&chars, i + 1, &mut line);
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
