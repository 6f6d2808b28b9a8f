//! A syntax check of Common Expression Language expressions (the cel-spec grammar), for
//! Telemetry access log filters: Envoy refuses a whole listener update whose CEL filter
//! does not parse, so an expression that does not is refused at validation, as istiod's
//! `validateTelemetryFilter` parses it. Names are not resolved (Envoy does not either).

/// Why an expression does not parse as CEL.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum CelError {
    #[error("unexpected character {0:?}")]
    Character(char),
    #[error("an unterminated string")]
    UnterminatedString,
    #[error("{0} without digits")]
    NoDigits(&'static str),
    #[error("expected {expected:?}, found {found}")]
    Expected { expected: String, found: Token },
    #[error("expected {0:?} at the end")]
    ExpectedAtEnd(String),
    #[error("expected a name, found {}", .0.as_ref().map_or("the end".to_string(), Token::to_string))]
    ExpectedName(Option<Token>),
    #[error("unexpected {0}")]
    Unexpected(Token),
    #[error("unexpected {0} after the expression")]
    Trailing(Token),
    #[error("the expression ends too soon")]
    EndsTooSoon,
}

/// Whether `text` parses as one CEL expression; the error says where it does not.
pub fn check(text: &str) -> Result<(), CelError> {
    let tokens = lex(text)?;
    let mut p = Parser { tokens, at: 0 };
    p.expr(0)?;
    match p.peek() {
        None => Ok(()),
        Some(t) => Err(CelError::Trailing(t.clone())),
    }
}

/// A token of the expression, as an error shows it.
#[derive(Clone, Debug, PartialEq)]
pub enum Token {
    Ident(String),
    Literal,
    Punct(&'static str),
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Token::Ident(name) => write!(f, "the name {name:?}"),
            Token::Literal => f.write_str("a literal"),
            Token::Punct(p) => write!(f, "{p:?}"),
        }
    }
}

const PUNCTS: [&str; 25] = [
    "||", "&&", "<=", ">=", "==", "!=", "<", ">", "+", "-", "*", "/", "%", "!", "?", ":", ".", ",",
    "(", ")", "[", "]", "{", "}", "in",
];

fn lex(text: &str) -> Result<Vec<Token>, CelError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        // A string or bytes literal, with its raw (r) and bytes (b) prefixes.
        let prefix = (chars[i..].iter())
            .take_while(|c| matches!(c, 'r' | 'R' | 'b' | 'B'))
            .count();
        if prefix <= 2 && matches!(chars.get(i + prefix), Some('"' | '\'')) {
            let raw = chars[i..i + prefix].iter().any(|c| matches!(c, 'r' | 'R'));
            i = string_end(&chars, i + prefix, raw)?;
            out.push(Token::Literal);
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            out.push(match word.as_str() {
                "in" => Token::Punct("in"),
                "true" | "false" | "null" => Token::Literal,
                _ => Token::Ident(word),
            });
            continue;
        }
        if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            i = number_end(&chars, i)?;
            out.push(Token::Literal);
            continue;
        }
        let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
        let Some(p) = (PUNCTS.iter()).find(|p| *p != &"in" && rest.starts_with(**p)) else {
            return Err(CelError::Character(c));
        };
        out.push(Token::Punct(p));
        i += p.len();
    }
    Ok(out)
}

/// The index after the string literal whose quote is at `i`.
fn string_end(chars: &[char], i: usize, raw: bool) -> Result<usize, CelError> {
    let q = chars[i];
    let triple = chars.get(i + 1) == Some(&q) && chars.get(i + 2) == Some(&q);
    let mut j = if triple { i + 3 } else { i + 1 };
    while j < chars.len() {
        let c = chars[j];
        if c == '\\' && !raw {
            j += 2;
            continue;
        }
        if triple {
            if c == q && chars.get(j + 1) == Some(&q) && chars.get(j + 2) == Some(&q) {
                return Ok(j + 3);
            }
        } else if c == q {
            return Ok(j + 1);
        } else if c == '\n' {
            break;
        }
        j += 1;
    }
    Err(CelError::UnterminatedString)
}

/// The index after the number at `i`: decimal or hex integers (`u` for unsigned), and
/// floats with a fraction or an exponent.
fn number_end(chars: &[char], mut i: usize) -> Result<usize, CelError> {
    let digits = |i: &mut usize, hex: bool| {
        let start = *i;
        while *i < chars.len()
            && (chars[*i].is_ascii_digit() || (hex && chars[*i].is_ascii_hexdigit()))
        {
            *i += 1;
        }
        *i > start
    };
    if chars[i] == '0' && matches!(chars.get(i + 1), Some('x' | 'X')) {
        i += 2;
        if !digits(&mut i, true) {
            return Err(CelError::NoDigits("a hex number"));
        }
    } else {
        let whole = digits(&mut i, false);
        let mut float = false;
        if chars.get(i) == Some(&'.') && chars.get(i + 1).is_some_and(char::is_ascii_digit) {
            i += 1;
            digits(&mut i, false);
            float = true;
        }
        if matches!(chars.get(i), Some('e' | 'E')) {
            i += 1;
            if matches!(chars.get(i), Some('+' | '-')) {
                i += 1;
            }
            if !digits(&mut i, false) {
                return Err(CelError::NoDigits("an exponent"));
            }
            float = true;
        }
        if !whole && !float {
            return Err(CelError::NoDigits("a number"));
        }
        if float {
            return Ok(i);
        }
    }
    if matches!(chars.get(i), Some('u' | 'U')) {
        i += 1;
    }
    Ok(i)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

/// Binary operators by precedence level, loosest first.
const LEVELS: [&[&str]; 5] = [
    &["||"],
    &["&&"],
    &["<", "<=", ">=", ">", "==", "!=", "in"],
    &["+", "-"],
    &["*", "/", "%"],
];

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn eat(&mut self, p: &str) -> bool {
        let found = matches!(self.peek(), Some(Token::Punct(x)) if *x == p);
        if found {
            self.at += 1;
        }
        found
    }

    fn expect(&mut self, p: &str) -> Result<(), CelError> {
        if self.eat(p) {
            Ok(())
        } else {
            Err(match self.peek() {
                Some(t) => CelError::Expected {
                    expected: p.to_string(),
                    found: t.clone(),
                },
                None => CelError::ExpectedAtEnd(p.to_string()),
            })
        }
    }

    /// `Expr` (level 0, with the conditional) or a binary level's operand chain.
    fn expr(&mut self, level: usize) -> Result<(), CelError> {
        if level == LEVELS.len() {
            return self.unary();
        }
        self.expr(level + 1)?;
        while LEVELS[level].iter().any(|op| self.eat(op)) {
            self.expr(level + 1)?;
        }
        if level == 0 && self.eat("?") {
            self.expr(1)?;
            self.expect(":")?;
            self.expr(0)?;
        }
        Ok(())
    }

    fn unary(&mut self) -> Result<(), CelError> {
        while self.eat("!") || self.eat("-") {}
        self.member()
    }

    fn member(&mut self) -> Result<(), CelError> {
        self.primary()?;
        loop {
            if self.eat(".") {
                self.ident()?;
                if self.eat("(") {
                    self.list(")")?;
                }
            } else if self.eat("[") {
                self.expr(0)?;
                self.expect("]")?;
            } else if self.eat("{") {
                // A message construction `a.b.Type{field: value}`.
                self.inits("}", true)?;
            } else {
                return Ok(());
            }
        }
    }

    fn ident(&mut self) -> Result<(), CelError> {
        match self.peek() {
            Some(Token::Ident(_)) => {
                self.at += 1;
                Ok(())
            }
            other => Err(CelError::ExpectedName(other.cloned())),
        }
    }

    fn primary(&mut self) -> Result<(), CelError> {
        self.eat(".");
        match self.peek().cloned() {
            Some(Token::Ident(_)) => {
                self.at += 1;
                if self.eat("(") {
                    self.list(")")?;
                }
                Ok(())
            }
            Some(Token::Literal) => {
                self.at += 1;
                Ok(())
            }
            Some(Token::Punct("(")) => {
                self.at += 1;
                self.expr(0)?;
                self.expect(")")
            }
            Some(Token::Punct("[")) => {
                self.at += 1;
                self.list("]")
            }
            Some(Token::Punct("{")) => {
                self.at += 1;
                self.inits("}", false)
            }
            Some(t) => Err(CelError::Unexpected(t)),
            None => Err(CelError::EndsTooSoon),
        }
    }

    /// `Expr, ...` up to `close` (a trailing comma allowed).
    fn list(&mut self, close: &str) -> Result<(), CelError> {
        while !self.eat(close) {
            self.expr(0)?;
            if !self.eat(",") {
                return self.expect(close);
            }
        }
        Ok(())
    }

    /// `key: value, ...` up to `close`: map entries, or a message's fields (names).
    fn inits(&mut self, close: &str, fields: bool) -> Result<(), CelError> {
        while !self.eat(close) {
            if fields {
                self.ident()?;
            } else {
                self.expr(0)?;
            }
            self.expect(":")?;
            self.expr(0)?;
            if !self.eat(",") {
                return self.expect(close);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn expressions_envoy_takes_parse() {
        for ok in [
            "response.code >= 400",
            "response.code >= 400 && request.headers['x-debug'] == 'true'",
            "!(request.url_path.startsWith('/health'))",
            "request.method in ['GET', 'HEAD'] || response.code_details != \"via_upstream\"",
            "size(request.headers) > 0u ? true : false",
            "connection.mtls || -1.5e3 < 0x1F",
            "{'a': 1, 'b': [1, 2,],}.a == 1",
            "google.protobuf.Duration{seconds: 5} < duration('10s')",
            "r'raw \\d' + b\"bytes\" + '''multi\nline''' != ''",
            "unknown_name == 1",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn syntax_errors_are_refused() {
        for bad in [
            "response.code >=",
            "foo(",
            "a ? b",
            "(a",
            "a b",
            "'unterminated",
            "a.",
            "1e",
            "a @ b",
            "",
            "[1, 2",
            "{1 2}",
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            check("a b").unwrap_err().to_string(),
            "unexpected the name \"b\" after the expression"
        );
        assert_eq!(
            check("(a").unwrap_err().to_string(),
            "expected \")\" at the end"
        );
    }
}
