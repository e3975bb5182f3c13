//! Filter expressions over events: `host.cpu.user > 50`, `kind == "exit" and status != 0`.
//!
//! Used by producer subscriptions (`gma subscribe --when ...`) and action monitors (`when = ...`).
//!
//! ```text
//! expr    := or
//! or      := and ( ('or' | '||') and )*
//! and     := not ( ('and' | '&&') not )*
//! not     := ( 'not' | '!' ) not | primary
//! primary := '(' expr ')' | operand op operand
//! op      := '<' | '<=' | '>' | '>=' | '==' | '!=' | '='      ('=' is '==')
//! operand := number | string | field
//! ```
//!
//! Numbers are decimal (`-1.5e3`), strings are quoted with `"` or `'` (escapes `\" \' \\ \n \t`),
//! and a field is `pattern.field`: `host.cpu.user` is field `user` of the events whose name matches
//! the event-name pattern `host.cpu` (wildcards allowed: `host.*.user`); a bare `user` is field
//! `user` of any event that has it. Keywords are case-insensitive. A comparison needs at least
//! one field; ordering operators compare numbers only.
//!
//! A [`Filter`] is parsed once (errors name a 1-based character column), checked against the
//! schemas it may run on with [`Filter::validate`], and compiled per event schema with
//! [`Filter::bind`] into a [`Bound`] whose evaluation works on indices only. Evaluation is
//! three-valued: a comparison on a field the event lacks, or on a NaN value, is unknown.

use gma_proto::v1::{EventSchema, FieldSpec, FieldType};

use crate::pattern::Pattern;

/// Longest filter text accepted, in bytes.
pub const MAX_FILTER_LEN: usize = 4096;
/// Deepest nesting of parentheses and `not` accepted.
pub const MAX_DEPTH: usize = 64;
/// Most comparisons one filter may hold.
pub const MAX_COMPARISONS: usize = 256;

/// A filter that does not parse, or does not fit the schemas it is checked against.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at column {position}: {message}")]
pub struct FilterError {
    /// 1-based character column of the offending token.
    pub position: usize,
    pub message: String,
}

fn err(position: usize, message: impl Into<String>) -> FilterError {
    FilterError {
        position,
        message: message.into(),
    }
}

/// Shortens text quoted in an error message.
fn clip(s: &str) -> String {
    crate::clip(s, 40)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CmpOp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl CmpOp {
    fn symbol(self) -> &'static str {
        match self {
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
        }
    }

    fn is_ordering(self) -> bool {
        !matches!(self, CmpOp::Eq | CmpOp::Ne)
    }

    /// The operator with its operands swapped: `3 < x` is `x > 3`.
    fn flip(self) -> CmpOp {
        match self {
            CmpOp::Lt => CmpOp::Gt,
            CmpOp::Le => CmpOp::Ge,
            CmpOp::Gt => CmpOp::Lt,
            CmpOp::Ge => CmpOp::Le,
            other => other,
        }
    }

    #[inline]
    fn numbers(self, a: f64, b: f64) -> bool {
        match self {
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
        }
    }
}

/// A field reference as written: `host.cpu.user` (prefix `host.cpu`) or bare `user`.
#[derive(Debug, Clone)]
struct FieldRef {
    /// Position among the field references of the filter, in source order.
    id: usize,
    col: usize,
    text: String,
    prefix: Option<Pattern>,
    name: String,
}

#[derive(Debug, Clone)]
enum Tok {
    LParen,
    RParen,
    And,
    Or,
    Not,
    Op(CmpOp),
    Num(f64),
    Str(String),
    Field(FieldRef),
    Eof,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    col: usize,
    /// The source text of the token, for messages.
    text: String,
}

fn describe(t: &Token) -> String {
    match t.tok {
        Tok::Eof => "end of input".to_string(),
        Tok::Str(_) => format!("string {}", clip(&t.text)),
        _ => format!("'{}'", clip(&t.text)),
    }
}

fn is_word_start(c: char) -> bool {
    c.is_ascii_alphabetic() || matches!(c, '_' | '*' | '?')
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '*' | '?')
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

struct Lexer {
    chars: Vec<char>,
    pos: usize,
}

impl Lexer {
    fn at(&self, i: usize) -> Option<char> {
        self.chars.get(i).copied()
    }

    fn digit_at(&self, i: usize) -> bool {
        self.at(i).is_some_and(|c| c.is_ascii_digit())
    }

    fn slice(&self, start: usize, end: usize) -> String {
        self.chars.get(start..end).unwrap_or(&[]).iter().collect()
    }

    fn found_at(&self, i: usize) -> String {
        match self.at(i) {
            None => "end of input".to_string(),
            Some(c) => format!("{c:?}"),
        }
    }

    fn next_token(&mut self) -> Result<Token, FilterError> {
        while self.at(self.pos).is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
        let start = self.pos;
        let col = start + 1;
        let Some(c) = self.at(start) else {
            return Ok(Token {
                tok: Tok::Eof,
                col,
                text: String::new(),
            });
        };
        let next = self.at(start + 1);
        let (tok, len) = match c {
            '(' => (Tok::LParen, 1),
            ')' => (Tok::RParen, 1),
            '&' if next == Some('&') => (Tok::And, 2),
            '|' if next == Some('|') => (Tok::Or, 2),
            '&' | '|' => {
                return Err(err(
                    col,
                    format!(
                        "expected '{c}{c}', found '{c}' followed by {}",
                        self.found_at(start + 1)
                    ),
                ))
            }
            '!' if next == Some('=') => (Tok::Op(CmpOp::Ne), 2),
            '!' => (Tok::Not, 1),
            '=' if next == Some('=') => (Tok::Op(CmpOp::Eq), 2),
            '=' => (Tok::Op(CmpOp::Eq), 1),
            '<' if next == Some('=') => (Tok::Op(CmpOp::Le), 2),
            '<' => (Tok::Op(CmpOp::Lt), 1),
            '>' if next == Some('=') => (Tok::Op(CmpOp::Ge), 2),
            '>' => (Tok::Op(CmpOp::Gt), 1),
            '"' | '\'' => return self.string(start, c),
            '-' => return self.number(start),
            c if c.is_ascii_digit() => return self.number(start),
            c if is_word_start(c) => return self.word(start),
            c => {
                return Err(err(
                    col,
                    format!(
                        "expected a field, number, string, operator, '(' or ')', \
                         found unexpected character {c:?}"
                    ),
                ))
            }
        };
        self.pos = start + len;
        Ok(Token {
            tok,
            col,
            text: self.slice(start, start + len),
        })
    }

    fn string(&mut self, start: usize, quote: char) -> Result<Token, FilterError> {
        let mut value = String::new();
        let mut i = start + 1;
        let unterminated = || {
            err(
                start + 1,
                format!("unterminated string: expected a closing {quote} before end of input"),
            )
        };
        loop {
            match self.at(i) {
                None => return Err(unterminated()),
                Some('\\') => {
                    let escaped = match self.at(i + 1) {
                        None => return Err(unterminated()),
                        Some('n') => '\n',
                        Some('t') => '\t',
                        Some(c @ ('"' | '\'' | '\\')) => c,
                        Some(c) => {
                            return Err(err(
                                i + 1,
                                format!(
                                    "expected one of the escapes \\\" \\' \\\\ \\n \\t, \
                                     found unknown escape \\{c}"
                                ),
                            ))
                        }
                    };
                    value.push(escaped);
                    i += 2;
                }
                Some(c) if c == quote => break,
                Some(c) => {
                    value.push(c);
                    i += 1;
                }
            }
        }
        self.pos = i + 1;
        Ok(Token {
            tok: Tok::Str(value),
            col: start + 1,
            text: self.slice(start, i + 1),
        })
    }

    fn number(&mut self, start: usize) -> Result<Token, FilterError> {
        let col = start + 1;
        let mut i = start;
        if self.at(i) == Some('-') {
            i += 1;
            if !self.digit_at(i) {
                return Err(err(
                    i + 1,
                    format!("expected a digit after '-', found {}", self.found_at(i)),
                ));
            }
        }
        while self.digit_at(i) {
            i += 1;
        }
        if self.at(i) == Some('.') && self.digit_at(i + 1) {
            i += 1;
            while self.digit_at(i) {
                i += 1;
            }
        }
        if matches!(self.at(i), Some('e' | 'E')) {
            let mut j = i + 1;
            if matches!(self.at(j), Some('+' | '-')) {
                j += 1;
            }
            if self.digit_at(j) {
                i = j;
                while self.digit_at(i) {
                    i += 1;
                }
            }
        }
        if self
            .at(i)
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        {
            let mut j = i;
            while self
                .at(j)
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
            {
                j += 1;
            }
            return Err(err(
                col,
                format!(
                    "expected a number, found malformed '{}'",
                    clip(&self.slice(start, j))
                ),
            ));
        }
        let text = self.slice(start, i);
        let value: f64 = text.parse().map_err(|_| {
            err(
                col,
                format!("expected a number, found malformed '{}'", clip(&text)),
            )
        })?;
        if !value.is_finite() {
            return Err(err(col, format!("number '{}' is out of range", clip(&text))));
        }
        self.pos = i;
        Ok(Token {
            tok: Tok::Num(value),
            col,
            text,
        })
    }

    fn word(&mut self, start: usize) -> Result<Token, FilterError> {
        let col = start + 1;
        let mut end = start;
        while self.at(end).is_some_and(is_word_char) {
            end += 1;
        }
        self.pos = end;
        // A word holds ASCII only, so byte offsets within it are character offsets.
        let text = self.slice(start, end);
        let tok = match text.rfind('.') {
            None => match text.to_ascii_lowercase().as_str() {
                "and" => Tok::And,
                "or" => Tok::Or,
                "not" => Tok::Not,
                _ if text.contains(['*', '?']) => {
                    return Err(err(
                        col,
                        format!(
                            "expected a field name, found '{}' \
                             (wildcards belong to the event-name part, as in 'host.*.user')",
                            clip(&text)
                        ),
                    ))
                }
                _ => Tok::Field(FieldRef {
                    id: 0,
                    col,
                    text: text.clone(),
                    prefix: None,
                    name: text.clone(),
                }),
            },
            Some(dot) => {
                let (prefix, name) = (&text[..dot], &text[dot + 1..]);
                let name_col = col + dot + 1;
                if name.is_empty() {
                    return Err(err(
                        name_col,
                        format!(
                            "expected a field name after '{}.', found {}",
                            clip(prefix),
                            self.found_at(end)
                        ),
                    ));
                }
                if !is_ident(name) {
                    return Err(err(
                        name_col,
                        format!(
                            "expected a field name (a letter or '_', then letters, digits, '_' or '-') \
                             after '{}.', found '{}'",
                            clip(prefix),
                            clip(name)
                        ),
                    ));
                }
                let pattern = Pattern::event(prefix).map_err(|e| {
                    err(
                        col + e.position,
                        format!("invalid event-name pattern '{}': {}", clip(prefix), e.message),
                    )
                })?;
                Tok::Field(FieldRef {
                    id: 0,
                    col,
                    text: text.clone(),
                    prefix: Some(pattern),
                    name: name.to_string(),
                })
            }
        };
        Ok(Token { tok, col, text })
    }
}

#[derive(Debug, Clone)]
enum CmpKind {
    Num(FieldRef, f64),
    Str(FieldRef, String),
    Fields(FieldRef, FieldRef),
}

/// One comparison, normalized so a field comes first (`3 < x` is stored as `x > 3`).
#[derive(Debug, Clone)]
struct Cmp {
    /// Position among the comparisons of the filter, in source order.
    id: usize,
    op: CmpOp,
    op_col: usize,
    kind: CmpKind,
}

#[derive(Debug, Clone)]
enum Expr {
    Cmp(Box<Cmp>),
    Not(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
}

enum Value {
    Num(f64),
    Str(String),
    Field(FieldRef),
}

struct Operand {
    value: Value,
    col: usize,
    text: String,
}

struct Parser {
    lex: Lexer,
    peeked: Option<Token>,
    depth: usize,
    comparisons: usize,
    fields: usize,
}

impl Parser {
    fn peek(&mut self) -> Result<&Token, FilterError> {
        let t = match self.peeked.take() {
            Some(t) => t,
            None => self.lex.next_token()?,
        };
        Ok(self.peeked.insert(t))
    }

    fn bump(&mut self) -> Result<Token, FilterError> {
        match self.peeked.take() {
            Some(t) => Ok(t),
            None => self.lex.next_token(),
        }
    }

    fn enter(&mut self, col: usize) -> Result<(), FilterError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(err(
                col,
                format!("expected at most {MAX_DEPTH} levels of parentheses and 'not', found more"),
            ));
        }
        Ok(())
    }

    fn or(&mut self) -> Result<Expr, FilterError> {
        self.joined(|t| matches!(t, Tok::Or), Self::and, Expr::Or)
    }

    fn and(&mut self) -> Result<Expr, FilterError> {
        self.joined(|t| matches!(t, Tok::And), Self::not, Expr::And)
    }

    /// One `operand`, or several joined by the operator `is_op` recognizes: `join` of them.
    fn joined(
        &mut self,
        is_op: fn(&Tok) -> bool,
        operand: fn(&mut Self) -> Result<Expr, FilterError>,
        join: fn(Vec<Expr>) -> Expr,
    ) -> Result<Expr, FilterError> {
        let first = operand(self)?;
        if !is_op(&self.peek()?.tok) {
            return Ok(first);
        }
        let mut items = vec![first];
        while is_op(&self.peek()?.tok) {
            self.bump()?;
            items.push(operand(self)?);
        }
        Ok(join(items))
    }

    fn not(&mut self) -> Result<Expr, FilterError> {
        if matches!(self.peek()?.tok, Tok::Not) {
            let t = self.bump()?;
            self.enter(t.col)?;
            let inner = self.not()?;
            self.depth -= 1;
            return Ok(Expr::Not(Box::new(inner)));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, FilterError> {
        if matches!(self.peek()?.tok, Tok::LParen) {
            let open = self.bump()?;
            self.enter(open.col)?;
            let inner = self.or()?;
            let close = self.bump()?;
            if !matches!(close.tok, Tok::RParen) {
                return Err(err(
                    close.col,
                    format!(
                        "expected 'and', 'or' or ')' to close the '(' at column {}, found {}",
                        open.col,
                        describe(&close)
                    ),
                ));
            }
            self.depth -= 1;
            return Ok(inner);
        }
        self.comparison()
    }

    fn operand(&mut self, after: Option<&str>) -> Result<Operand, FilterError> {
        let t = self.bump()?;
        let value = match t.tok {
            Tok::Num(v) => Value::Num(v),
            Tok::Str(s) => Value::Str(s),
            Tok::Field(mut f) => {
                f.id = self.fields;
                self.fields += 1;
                Value::Field(f)
            }
            _ => {
                let message = match after {
                    None => format!(
                        "expected a field, number, string, '(' or 'not', found {}",
                        describe(&t)
                    ),
                    Some(op) => format!(
                        "expected a number, string or field after '{op}', found {}",
                        describe(&t)
                    ),
                };
                return Err(err(t.col, message));
            }
        };
        Ok(Operand {
            value,
            col: t.col,
            text: t.text,
        })
    }

    fn comparison(&mut self) -> Result<Expr, FilterError> {
        let start = self.peek()?.col;
        if self.comparisons >= MAX_COMPARISONS {
            return Err(err(
                start,
                format!("expected at most {MAX_COMPARISONS} comparisons, found more"),
            ));
        }
        let left = self.operand(None)?;
        let t = self.bump()?;
        let Tok::Op(op) = t.tok else {
            let left_text = match left.value {
                Value::Str(_) => format!("string {}", clip(&left.text)),
                _ => format!("'{}'", clip(&left.text)),
            };
            return Err(err(
                t.col,
                format!(
                    "expected a comparison operator (<, <=, >, >=, ==, !=) after {left_text}, found {}",
                    describe(&t)
                ),
            ));
        };
        let right = self.operand(Some(&t.text))?;
        let ordering_string = |col: usize, text: &str| {
            err(
                col,
                format!(
                    "'{}' compares numbers only, found string {} (strings take == or !=)",
                    t.text,
                    clip(text)
                ),
            )
        };
        let kind = match (left.value, right.value) {
            (Value::Field(a), Value::Field(b)) => (op, CmpKind::Fields(a, b)),
            (Value::Field(a), Value::Num(v)) => (op, CmpKind::Num(a, v)),
            (Value::Num(v), Value::Field(a)) => (op.flip(), CmpKind::Num(a, v)),
            (Value::Field(_), Value::Str(_)) if op.is_ordering() => {
                return Err(ordering_string(right.col, &right.text))
            }
            (Value::Str(_), Value::Field(_)) if op.is_ordering() => {
                return Err(ordering_string(left.col, &left.text))
            }
            (Value::Field(a), Value::Str(s)) | (Value::Str(s), Value::Field(a)) => (op, CmpKind::Str(a, s)),
            _ => {
                return Err(err(
                    left.col,
                    format!(
                        "expected a field on at least one side of '{}', found two constants",
                        t.text
                    ),
                ))
            }
        };
        let id = self.comparisons;
        self.comparisons += 1;
        Ok(Expr::Cmp(Box::new(Cmp {
            id,
            op: kind.0,
            op_col: t.col,
            kind: kind.1,
        })))
    }
}

/// A parsed filter expression. Parse once with [`Filter::parse`], then [`Filter::bind`] per event
/// schema.
#[derive(Debug, Clone)]
pub struct Filter {
    text: String,
    expr: Expr,
    fields: usize,
    comparisons: usize,
}

impl Filter {
    /// Parses a filter; an error names the 1-based character column of the problem.
    pub fn parse(text: &str) -> Result<Filter, FilterError> {
        if text.len() > MAX_FILTER_LEN {
            let fitting = text
                .char_indices()
                .take_while(|(i, c)| i + c.len_utf8() <= MAX_FILTER_LEN)
                .count();
            return Err(err(
                fitting + 1,
                format!(
                    "expected at most {MAX_FILTER_LEN} bytes of filter, found {}",
                    text.len()
                ),
            ));
        }
        let mut p = Parser {
            lex: Lexer {
                chars: text.chars().collect(),
                pos: 0,
            },
            peeked: None,
            depth: 0,
            comparisons: 0,
            fields: 0,
        };
        let expr = p.or()?;
        let t = p.bump()?;
        if !matches!(t.tok, Tok::Eof) {
            return Err(err(
                t.col,
                format!("expected 'and', 'or' or end of input, found {}", describe(&t)),
            ));
        }
        Ok(Filter {
            text: text.to_string(),
            expr,
            fields: p.fields,
            comparisons: p.comparisons,
        })
    }

    /// The text the filter was parsed from.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Checks the expression against the schemas it may run on (the schemas of the event names a
    /// subscription selects). Every field reference must resolve in at least one schema whose name
    /// matches its prefix; ordering operators (< <= > >=) need DOUBLE fields vs numbers; == and !=
    /// may compare a STRING field with a string or a DOUBLE field with a number; comparing a DOUBLE
    /// field with a string (or STRING with number) is an error. A comparison of two fields needs
    /// one schema holding both. Error names the position.
    pub fn validate(&self, schemas: &[EventSchema]) -> Result<(), FilterError> {
        let mut marks = Marks {
            prefix: vec![false; self.fields],
            field: vec![false; self.fields],
            cmp: vec![false; self.comparisons],
        };
        for s in schemas {
            let mut binder = Binder {
                name: &s.name,
                fields: &s.fields,
                any: false,
                marks: Some(&mut marks),
            };
            binder.compile(&self.expr)?;
        }
        let mut cmps = Vec::with_capacity(self.comparisons);
        collect(&self.expr, &mut cmps);
        let marked = |v: &[bool], i: usize| v.get(i).copied().unwrap_or(false);
        for c in cmps {
            let refs: [Option<&FieldRef>; 2] = match &c.kind {
                CmpKind::Num(f, _) | CmpKind::Str(f, _) => [Some(f), None],
                CmpKind::Fields(a, b) => [Some(a), Some(b)],
            };
            for f in refs.into_iter().flatten() {
                if marked(&marks.field, f.id) {
                    continue;
                }
                let message = match &f.prefix {
                    None => format!(
                        "unknown field '{}': no event has a field '{}'",
                        clip(&f.text),
                        clip(&f.name)
                    ),
                    Some(p) if !marked(&marks.prefix, f.id) => {
                        format!(
                            "unknown field '{}': no event matches '{}'",
                            clip(&f.text),
                            clip(p.as_str())
                        )
                    }
                    Some(p) => format!(
                        "unknown field '{}': no event matching '{}' has a field '{}'",
                        clip(&f.text),
                        clip(p.as_str()),
                        clip(&f.name)
                    ),
                };
                return Err(err(f.col, message));
            }
            if let CmpKind::Fields(a, b) = &c.kind {
                if !marked(&marks.cmp, c.id) {
                    return Err(err(
                        c.op_col,
                        format!(
                            "fields '{}' and '{}' are never in the same event, so '{}' can never be decided",
                            clip(&a.text),
                            clip(&b.text),
                            c.op.symbol()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Compiles the expression for one event name + schema fields. Ok(None) when no field
    /// reference of the expression resolves for this event (the filter does not apply to it).
    /// Type errors -> Err.
    pub fn bind(&self, name: &str, fields: &[FieldSpec]) -> Result<Option<Bound>, FilterError> {
        let mut binder = Binder {
            name,
            fields,
            any: false,
            marks: None,
        };
        let root = binder.compile(&self.expr)?;
        Ok(binder.any.then_some(Bound { root }))
    }
}

fn collect<'e>(e: &'e Expr, out: &mut Vec<&'e Cmp>) {
    match e {
        Expr::Cmp(c) => out.push(c),
        Expr::Not(inner) => collect(inner, out),
        Expr::And(items) | Expr::Or(items) => {
            for i in items {
                collect(i, out);
            }
        }
    }
}

/// What [`Filter::validate`] learns across schemas, indexed by field-reference / comparison id.
struct Marks {
    /// Some schema name matched the reference's prefix.
    prefix: Vec<bool>,
    /// The reference resolved in some schema.
    field: Vec<bool>,
    /// Both fields of a field-vs-field comparison resolved in one schema.
    cmp: Vec<bool>,
}

fn mark(v: &mut [bool], i: usize) {
    if let Some(x) = v.get_mut(i) {
        *x = true;
    }
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    Num(usize),
    Str(usize),
}

impl Slot {
    fn type_name(self) -> &'static str {
        match self {
            Slot::Num(_) => "double",
            Slot::Str(_) => "string",
        }
    }
}

struct Binder<'a, 'm> {
    name: &'a str,
    fields: &'a [FieldSpec],
    any: bool,
    marks: Option<&'m mut Marks>,
}

impl Binder<'_, '_> {
    fn resolve(&mut self, f: &FieldRef) -> Option<Slot> {
        if let Some(p) = &f.prefix {
            if !p.matches(self.name) {
                return None;
            }
        }
        if let Some(m) = self.marks.as_deref_mut() {
            mark(&mut m.prefix, f.id);
        }
        let (mut numbers, mut strings) = (0, 0);
        for spec in self.fields {
            let is_string = spec.r#type() == FieldType::String;
            if spec.name == f.name {
                self.any = true;
                if let Some(m) = self.marks.as_deref_mut() {
                    mark(&mut m.field, f.id);
                }
                return Some(if is_string {
                    Slot::Str(strings)
                } else {
                    Slot::Num(numbers)
                });
            }
            if is_string {
                strings += 1;
            } else {
                numbers += 1;
            }
        }
        None
    }

    fn mismatch(&self, f: &FieldRef, slot: Slot, constant: &str, op: CmpOp) -> FilterError {
        err(
            f.col,
            format!(
                "field '{}' is a {} in event '{}', cannot compare it with a {constant} using '{}'",
                clip(&f.text),
                slot.type_name(),
                clip(self.name),
                op.symbol()
            ),
        )
    }

    fn compile(&mut self, e: &Expr) -> Result<Node, FilterError> {
        Ok(match e {
            Expr::Cmp(c) => self.cmp(c)?,
            Expr::Not(inner) => match self.compile(inner)? {
                Node::Unknown => Node::Unknown,
                n => Node::Not(Box::new(n)),
            },
            Expr::And(items) => match self.compile_all(items)? {
                Some(nodes) => Node::And(nodes),
                None => Node::Unknown,
            },
            Expr::Or(items) => match self.compile_all(items)? {
                Some(nodes) => Node::Or(nodes),
                None => Node::Unknown,
            },
        })
    }

    /// Compiles the operands of `and`/`or`; None when all of them are unknown.
    fn compile_all(&mut self, items: &[Expr]) -> Result<Option<Box<[Node]>>, FilterError> {
        let nodes = items
            .iter()
            .map(|i| self.compile(i))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((!nodes.iter().all(|n| matches!(n, Node::Unknown))).then(|| nodes.into_boxed_slice()))
    }

    fn cmp(&mut self, c: &Cmp) -> Result<Node, FilterError> {
        let op = c.op;
        Ok(match &c.kind {
            CmpKind::Num(f, value) => match self.resolve(f) {
                None => Node::Unknown,
                Some(Slot::Num(index)) => Node::Num {
                    index,
                    op,
                    value: *value,
                },
                Some(slot) => return Err(self.mismatch(f, slot, "number", op)),
            },
            CmpKind::Str(f, value) => match self.resolve(f) {
                None => Node::Unknown,
                Some(Slot::Str(index)) => Node::Str {
                    index,
                    equal: op == CmpOp::Eq,
                    value: value.as_str().into(),
                },
                Some(slot) => return Err(self.mismatch(f, slot, "string", op)),
            },
            CmpKind::Fields(a, b) => {
                let (ra, rb) = (self.resolve(a), self.resolve(b));
                if let (Some(_), Some(_), Some(m)) = (ra, rb, self.marks.as_deref_mut()) {
                    mark(&mut m.cmp, c.id);
                }
                match (ra, rb) {
                    (Some(Slot::Num(a)), Some(Slot::Num(b))) => Node::NumField { a, op, b },
                    (Some(Slot::Str(x)), Some(Slot::Str(y))) if !op.is_ordering() => Node::StrField {
                        a: x,
                        equal: op == CmpOp::Eq,
                        b: y,
                    },
                    (Some(sa), Some(sb)) => {
                        return Err(err(
                            c.op_col,
                            format!(
                            "cannot compare field '{}' ({}) with field '{}' ({}) using '{}' in event '{}'{}",
                            clip(&a.text),
                            sa.type_name(),
                            clip(&b.text),
                            sb.type_name(),
                            op.symbol(),
                            clip(self.name),
                            if op.is_ordering() {
                                " (ordering needs two doubles)"
                            } else {
                                ""
                            }
                        ),
                        ))
                    }
                    _ => Node::Unknown,
                }
            }
        })
    }
}

#[derive(Debug, Clone)]
enum Node {
    /// A comparison on a field this event does not have.
    Unknown,
    Num {
        index: usize,
        op: CmpOp,
        value: f64,
    },
    NumField {
        a: usize,
        op: CmpOp,
        b: usize,
    },
    Str {
        index: usize,
        equal: bool,
        value: Box<str>,
    },
    StrField {
        a: usize,
        equal: bool,
        b: usize,
    },
    Not(Box<Node>),
    And(Box<[Node]>),
    Or(Box<[Node]>),
}

#[inline]
fn number(numbers: &[f64], index: usize) -> Option<f64> {
    numbers.get(index).copied().filter(|v| !v.is_nan())
}

fn eval(node: &Node, numbers: &[f64], strings: &[String]) -> Option<bool> {
    match node {
        Node::Unknown => None,
        Node::Num { index, op, value } => Some(op.numbers(number(numbers, *index)?, *value)),
        Node::NumField { a, op, b } => Some(op.numbers(number(numbers, *a)?, number(numbers, *b)?)),
        Node::Str { index, equal, value } => Some((strings.get(*index)?.as_str() == &**value) == *equal),
        Node::StrField { a, equal, b } => Some((strings.get(*a)? == strings.get(*b)?) == *equal),
        Node::Not(inner) => eval(inner, numbers, strings).map(|v| !v),
        // `and` is decided by a false item, `or` by a true one.
        Node::And(items) => decided_by(false, items, numbers, strings),
        Node::Or(items) => decided_by(true, items, numbers, strings),
    }
}

/// `and` (`decisive` false) or `or` (`decisive` true) of `items` in three-valued logic: the
/// decisive value if any item has it, else unknown if any item is unknown, else the other value.
fn decided_by(decisive: bool, items: &[Node], numbers: &[f64], strings: &[String]) -> Option<bool> {
    let mut unknown = false;
    for i in items {
        match eval(i, numbers, strings) {
            Some(v) if v == decisive => return Some(decisive),
            None => unknown = true,
            Some(_) => {}
        }
    }
    (!unknown).then_some(!decisive)
}

/// A filter compiled for one event schema: field references are indices into the event's
/// `numbers` / `strings`.
#[derive(Debug, Clone)]
pub struct Bound {
    root: Node,
}

impl Bound {
    /// Three-valued (Kleene) evaluation: Some(true)/Some(false), None = unknown. A comparison whose
    /// field does not exist in this event, or whose DOUBLE value is NaN, is unknown. not(unknown) =
    /// unknown; false and unknown = false; true or unknown = true. Does not allocate.
    #[inline]
    pub fn eval(&self, numbers: &[f64], strings: &[String]) -> Option<bool> {
        eval(&self.root, numbers, strings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{dbl, text};

    fn d(name: &str) -> FieldSpec {
        dbl(name, "", "")
    }

    fn s(name: &str) -> FieldSpec {
        text(name, "")
    }

    fn schema(name: &str, fields: Vec<FieldSpec>) -> EventSchema {
        EventSchema {
            name: name.to_string(),
            version: 1,
            fields,
            description: String::new(),
        }
    }

    fn abc() -> Vec<FieldSpec> {
        vec![d("a"), d("b"), d("c")]
    }

    fn bound(filter: &str, name: &str, fields: &[FieldSpec]) -> Bound {
        Filter::parse(filter)
            .unwrap()
            .bind(name, fields)
            .unwrap()
            .unwrap()
    }

    /// Evaluates `filter` on doubles a, b, c of event `t`.
    fn on_abc(filter: &str, numbers: [f64; 3]) -> Option<bool> {
        bound(filter, "t", &abc()).eval(&numbers, &[])
    }

    fn parse_err(filter: &str) -> FilterError {
        match Filter::parse(filter) {
            Ok(f) => panic!("{filter:?} parsed: {f:?}"),
            Err(e) => e,
        }
    }

    /// Asserts the parse error column and that the message contains `needle`.
    fn assert_parse_err(filter: &str, column: usize, needle: &str) {
        let e = parse_err(filter);
        assert_eq!(e.position, column, "{filter:?}: {e}");
        assert!(e.message.contains(needle), "{filter:?}: {e}");
    }

    fn exit_schema() -> Vec<FieldSpec> {
        vec![s("kind"), d("status"), s("cmd"), d("pid")]
    }

    #[test]
    fn precedence_and_binds_tighter_than_or() {
        let f = "a > 1 or b > 1 and c > 1";
        assert_eq!(on_abc(f, [2.0, 0.0, 0.0]), Some(true));
        assert_eq!(on_abc(f, [0.0, 2.0, 0.0]), Some(false));
        assert_eq!(on_abc(f, [0.0, 2.0, 2.0]), Some(true));
        assert_eq!(on_abc(f, [0.0, 0.0, 2.0]), Some(false));
        // Chains of the same operator.
        assert_eq!(on_abc("a > 1 and b > 1 and c > 1", [2.0, 2.0, 2.0]), Some(true));
        assert_eq!(on_abc("a > 1 and b > 1 and c > 1", [2.0, 2.0, 0.0]), Some(false));
        assert_eq!(on_abc("a > 1 or b > 1 or c > 1", [0.0, 0.0, 2.0]), Some(true));
    }

    #[test]
    fn parentheses_override_precedence() {
        let f = "(a > 1 or b > 1) and c > 1";
        assert_eq!(on_abc(f, [2.0, 0.0, 0.0]), Some(false));
        assert_eq!(on_abc(f, [2.0, 0.0, 2.0]), Some(true));
        assert_eq!(on_abc("((((a > 1))))", [2.0, 0.0, 0.0]), Some(true));
        assert_eq!(
            on_abc("a > 1 and (b > 1 or (c > 1))", [2.0, 0.0, 2.0]),
            Some(true)
        );
    }

    #[test]
    fn not_binds_to_the_next_comparison() {
        assert_eq!(on_abc("not a > 1", [2.0, 0.0, 0.0]), Some(false));
        assert_eq!(on_abc("!(a > 1)", [0.0, 0.0, 0.0]), Some(true));
        assert_eq!(on_abc("!a > 1", [0.0, 0.0, 0.0]), Some(true));
        assert_eq!(on_abc("NOT not a > 1", [2.0, 0.0, 0.0]), Some(true));
        // (not a > 1) and b > 1
        assert_eq!(on_abc("not a > 1 and b > 1", [0.0, 2.0, 0.0]), Some(true));
        assert_eq!(on_abc("not a > 1 and b > 1", [2.0, 2.0, 0.0]), Some(false));
        assert_eq!(on_abc("not (a > 1 and b > 1)", [2.0, 0.0, 0.0]), Some(true));
    }

    #[test]
    fn keywords_symbols_and_spacing() {
        assert_eq!(on_abc("a>1&&b<2||c>=5", [2.0, 1.0, 0.0]), Some(true));
        assert_eq!(on_abc("a>1 && b<2 || c>=5", [0.0, 1.0, 5.0]), Some(true));
        assert_eq!(on_abc("a > 1 AND b > 1 Or c > 1", [0.0, 0.0, 0.0]), Some(false));
        assert_eq!(on_abc("a<=1 and b!=1 and c==0", [1.0, 0.0, 0.0]), Some(true));
        assert_eq!(on_abc("a = 1", [1.0, 0.0, 0.0]), Some(true));
        assert_eq!(on_abc("a = 1", [1.5, 0.0, 0.0]), Some(false));
        assert_eq!(on_abc("a == 1", [1.0, 0.0, 0.0]), Some(true));
        assert_eq!(on_abc("\ta\n>\r\n1 ", [2.0, 0.0, 0.0]), Some(true));
        // Keywords only as whole words: these are fields.
        let fields = [d("android"), d("order"), d("nothing")];
        let b = bound("android > 1 and order > 1 and nothing > 1", "t", &fields);
        assert_eq!(b.eval(&[2.0, 2.0, 2.0], &[]), Some(true));
    }

    #[test]
    fn constants_on_the_left_are_flipped() {
        assert_eq!(on_abc("1 < a", [2.0, 0.0, 0.0]), Some(true));
        assert_eq!(on_abc("1 < a", [1.0, 0.0, 0.0]), Some(false));
        assert_eq!(on_abc("1 >= a", [1.0, 0.0, 0.0]), Some(true));
        assert_eq!(on_abc("1 > a", [1.0, 0.0, 0.0]), Some(false));
        assert_eq!(on_abc("3 == a", [3.0, 0.0, 0.0]), Some(true));
        assert_eq!(on_abc("3 != a", [3.0, 0.0, 0.0]), Some(false));
    }

    #[test]
    fn numbers_negative_fraction_exponent() {
        assert_eq!(on_abc("a > -1.5e2", [-149.0, 0.0, 0.0]), Some(true));
        assert_eq!(on_abc("a > -1.5e2", [-150.0, 0.0, 0.0]), Some(false));
        assert_eq!(on_abc("a == 2E+3", [2000.0, 0.0, 0.0]), Some(true));
        assert_eq!(on_abc("a == 125e-3", [0.125, 0.0, 0.0]), Some(true));
        assert_eq!(on_abc("a == -0", [0.0, 0.0, 0.0]), Some(true));
        assert_eq!(on_abc("a == 007.50", [7.5, 0.0, 0.0]), Some(true));
        assert_eq!(on_abc("a>-1", [0.0, 0.0, 0.0]), Some(true));
    }

    #[test]
    fn strings_and_escapes() {
        let fields = exit_schema();
        let f = Filter::parse(r#"kind == "exit" and status != 0"#).unwrap();
        let b = f.bind("app.proc", &fields).unwrap().unwrap();
        let strs = |k: &str, c: &str| vec![k.to_string(), c.to_string()];
        assert_eq!(b.eval(&[1.0, 10.0], &strs("exit", "")), Some(true));
        assert_eq!(b.eval(&[0.0, 10.0], &strs("exit", "")), Some(false));
        assert_eq!(b.eval(&[1.0, 10.0], &strs("start", "")), Some(false));
        assert_eq!(b.eval(&[1.0, 10.0], &strs("Exit", "")), Some(false));

        let b = bound("kind = 'exit'", "x", &fields);
        assert_eq!(b.eval(&[0.0, 0.0], &strs("exit", "")), Some(true));
        let b = bound("'exit' != kind", "x", &fields);
        assert_eq!(b.eval(&[0.0, 0.0], &strs("exit", "")), Some(false));

        let b = bound(r#"cmd == "a\"b'c\\d\n\t" or cmd == 'it\'s'"#, "x", &fields);
        assert_eq!(b.eval(&[0.0, 0.0], &strs("", "a\"b'c\\d\n\t")), Some(true));
        assert_eq!(b.eval(&[0.0, 0.0], &strs("", "it's")), Some(true));
        assert_eq!(b.eval(&[0.0, 0.0], &strs("", "its")), Some(false));

        let b = bound("cmd == 'héllo ✓'", "x", &fields);
        assert_eq!(b.eval(&[0.0, 0.0], &strs("", "héllo ✓")), Some(true));
        let b = bound("cmd == ''", "x", &fields);
        assert_eq!(b.eval(&[0.0, 0.0], &strs("", "")), Some(true));
    }

    #[test]
    fn field_against_field() {
        assert_eq!(on_abc("a > b", [2.0, 1.0, 0.0]), Some(true));
        assert_eq!(on_abc("a > b", [1.0, 1.0, 0.0]), Some(false));
        assert_eq!(on_abc("a == b", [f64::NAN, 1.0, 0.0]), None);
        let b = bound("kind != cmd", "x", &exit_schema());
        assert_eq!(
            b.eval(&[0.0, 0.0], &["x".to_string(), "x".to_string()]),
            Some(false)
        );
        assert_eq!(
            b.eval(&[0.0, 0.0], &["x".to_string(), "y".to_string()]),
            Some(true)
        );
    }

    #[test]
    fn prefix_globs_select_event_names() {
        let cpu = [d("user"), d("system")];
        let f = Filter::parse("host.*.user > 50").unwrap();
        let b = f.bind("host.cpu", &cpu).unwrap().unwrap();
        assert_eq!(b.eval(&[60.0, 0.0], &[]), Some(true));
        assert_eq!(b.eval(&[40.0, 0.0], &[]), Some(false));
        assert!(f.bind("net.cpu", &cpu).unwrap().is_none());
        assert!(f.bind("host", &cpu).unwrap().is_none());

        let f = Filter::parse("host.cpu.system >= 5").unwrap();
        assert_eq!(
            f.bind("host.cpu", &cpu).unwrap().unwrap().eval(&[0.0, 5.0], &[]),
            Some(true)
        );
        assert!(f.bind("host.cpux", &cpu).unwrap().is_none());

        let f = Filter::parse("h?st.c*.user > 1 and *.system > 1").unwrap();
        assert_eq!(
            f.bind("host.cpu", &cpu).unwrap().unwrap().eval(&[2.0, 2.0], &[]),
            Some(true)
        );
        assert!(f.bind("h.cpu", &[d("zzz")]).unwrap().is_none());
    }

    #[test]
    fn bare_fields_match_any_event_having_them() {
        let f = Filter::parse("user > 1").unwrap();
        let cpu = [s("label"), d("system"), d("user")];
        let b = f.bind("host.cpu", &cpu).unwrap().unwrap();
        assert_eq!(b.eval(&[0.0, 2.0], &["l".to_string()]), Some(true));
        let b = f.bind("app.other", &[d("user")]).unwrap().unwrap();
        assert_eq!(b.eval(&[0.0], &[]), Some(false));
        assert!(f.bind("host.mem", &[d("free")]).unwrap().is_none());
    }

    #[test]
    fn bind_returns_none_when_nothing_resolves() {
        let f = Filter::parse("host.cpu.user > 1 or kind == 'x'").unwrap();
        assert!(f.bind("host.mem", &[d("free")]).unwrap().is_none());
        // The prefix matches but the field is missing.
        assert!(f.bind("host.cpu", &[d("system")]).unwrap().is_none());
        // One reference resolving is enough.
        let b = f.bind("host.cpu", &[d("user")]).unwrap().unwrap();
        assert_eq!(b.eval(&[2.0], &[]), Some(true));
        assert_eq!(b.eval(&[0.0], &[]), None);
        assert!(f.bind("any", &[]).unwrap().is_none());
    }

    #[test]
    fn kleene_semantics_with_nan() {
        let nan = f64::NAN;
        assert_eq!(on_abc("a > 1", [nan, 0.0, 0.0]), None);
        assert_eq!(on_abc("a != 1", [nan, 0.0, 0.0]), None);
        assert_eq!(on_abc("not a > 1", [nan, 0.0, 0.0]), None);
        assert_eq!(on_abc("a > 1 and b > 1", [nan, 0.0, 0.0]), Some(false));
        assert_eq!(on_abc("a > 1 and b > 1", [nan, 2.0, 0.0]), None);
        assert_eq!(on_abc("b > 1 and a > 1", [nan, 0.0, 0.0]), Some(false));
        assert_eq!(on_abc("a > 1 or b > 1", [nan, 2.0, 0.0]), Some(true));
        assert_eq!(on_abc("b > 1 or a > 1", [nan, 2.0, 0.0]), Some(true));
        assert_eq!(on_abc("a > 1 or b > 1", [nan, 0.0, 0.0]), None);
        assert_eq!(on_abc("not (a > 1 or b > 1)", [nan, 2.0, 0.0]), Some(false));
        assert_eq!(on_abc("a > 1", [f64::INFINITY, 0.0, 0.0]), Some(true));
    }

    #[test]
    fn kleene_semantics_with_missing_fields() {
        let only_a = [d("a")];
        let b = bound("a > 1 and zz > 1", "t", &only_a);
        assert_eq!(b.eval(&[0.0], &[]), Some(false));
        assert_eq!(b.eval(&[2.0], &[]), None);
        let b = bound("a > 1 or zz > 1", "t", &only_a);
        assert_eq!(b.eval(&[2.0], &[]), Some(true));
        assert_eq!(b.eval(&[0.0], &[]), None);
        let b = bound("a > 1 or not (zz > 1 and yy == 'q')", "t", &only_a);
        assert_eq!(b.eval(&[0.0], &[]), None);
        // A field compared with a missing field is unknown.
        let b = bound("a == zz", "t", &only_a);
        assert_eq!(b.eval(&[0.0], &[]), None);
        // Slices shorter than the schema (a caller bug) give unknown, never a panic.
        let b = bound("c > 1 or kind == 'x'", "t", &[d("a"), d("b"), d("c"), s("kind")]);
        assert_eq!(b.eval(&[], &[]), None);
    }

    #[test]
    fn text_is_kept() {
        let f = Filter::parse("  a > 1 ").unwrap();
        assert_eq!(f.text(), "  a > 1 ");
    }

    #[test]
    fn error_display_names_the_column() {
        let e = parse_err("host.cpu.user >");
        assert_eq!(
            e.to_string(),
            "at column 16: expected a number, string or field after '>', found end of input"
        );
        assert_eq!(
            e,
            FilterError {
                position: 16,
                message: "expected a number, string or field after '>', found end of input".to_string()
            }
        );
    }

    #[test]
    fn error_unterminated_string_and_bad_escape() {
        assert_parse_err(
            r#"kind == "exit"#,
            9,
            "unterminated string: expected a closing \"",
        );
        assert_parse_err("kind == 'exit", 9, "unterminated string: expected a closing '");
        assert_parse_err(r#"kind == "exit\"#, 9, "unterminated string");
        assert_parse_err(r#"kind == "a\qb""#, 11, "found unknown escape \\q");
    }

    #[test]
    fn error_unexpected_token_or_character() {
        assert_parse_err(
            "a > > 1",
            5,
            "expected a number, string or field after '>', found '>'",
        );
        assert_parse_err("a > 1 # x", 7, "found unexpected character '#'");
        assert_parse_err("a & b", 3, "expected '&&', found '&'");
        assert_parse_err("a > 1 | b > 1", 7, "expected '||', found '|'");
        assert_parse_err(
            "a 1",
            3,
            "expected a comparison operator (<, <=, >, >=, ==, !=) after 'a', found '1'",
        );
        assert_parse_err("'x' 'y'", 5, "after string 'x', found string 'y'");
        assert_parse_err(
            "a > 1 and and b > 1",
            11,
            "expected a field, number, string, '(' or 'not', found 'and'",
        );
        assert_parse_err("and > 1", 1, "found 'and'");
        assert_parse_err("a === 1", 5, "after '==', found '='");
        assert_parse_err("a <> 1", 4, "after '<', found '>'");
        assert_parse_err("a > .5", 5, "unexpected character '.'");
    }

    #[test]
    fn error_missing_operand() {
        assert_parse_err(
            "",
            1,
            "expected a field, number, string, '(' or 'not', found end of input",
        );
        assert_parse_err("   ", 4, "found end of input");
        assert_parse_err(
            "> 1",
            1,
            "expected a field, number, string, '(' or 'not', found '>'",
        );
        assert_parse_err("a >", 4, "after '>', found end of input");
        assert_parse_err("a > 1 and", 10, "found end of input");
        assert_parse_err("a > 1 or ()", 11, "found ')'");
        assert_parse_err("not", 4, "found end of input");
        assert_parse_err("a", 2, "expected a comparison operator");
        // Columns count characters, not bytes.
        assert_parse_err("s == 'héllo' and", 17, "found end of input");
    }

    #[test]
    fn error_trailing_garbage_and_parentheses() {
        assert_parse_err("a > 1 b", 7, "expected 'and', 'or' or end of input, found 'b'");
        assert_parse_err("a > 1)", 6, "expected 'and', 'or' or end of input, found ')'");
        assert_parse_err("a > 1 < 2", 7, "found '<'");
        assert_parse_err(
            "(a > 1",
            7,
            "expected 'and', 'or' or ')' to close the '(' at column 1, found end of input",
        );
        assert_parse_err(
            "x > 0 and (a > 1 b",
            18,
            "to close the '(' at column 11, found 'b'",
        );
    }

    #[test]
    fn error_comparison_without_field() {
        assert_parse_err(
            "3 > 2",
            1,
            "expected a field on at least one side of '>', found two constants",
        );
        assert_parse_err("a > 1 or 'x' = \"y\"", 10, "on at least one side of '='");
        assert_parse_err("a > 1 or 2 == 'y'", 10, "found two constants");
    }

    #[test]
    fn error_ordering_with_string() {
        assert_parse_err("kind > 'x'", 8, "'>' compares numbers only, found string 'x'");
        assert_parse_err("'x' <= kind", 1, "'<=' compares numbers only");
    }

    #[test]
    fn error_bad_numbers() {
        assert_parse_err("a > 1x", 5, "expected a number, found malformed '1x'");
        assert_parse_err("a > 1.2.3", 5, "malformed '1.2.3'");
        assert_parse_err("a > 1e", 5, "malformed '1e'");
        assert_parse_err("a > 1.", 5, "malformed '1.'");
        assert_parse_err("a > 1e999", 5, "number '1e999' is out of range");
        assert_parse_err("a > - 1", 6, "expected a digit after '-', found ' '");
        assert_parse_err("a > -", 6, "expected a digit after '-', found end of input");
    }

    #[test]
    fn error_bad_field_references() {
        assert_parse_err("* > 1", 1, "expected a field name, found '*'");
        assert_parse_err("us?r > 1", 1, "found 'us?r'");
        assert_parse_err("host.* > 1", 6, "after 'host.', found '*'");
        assert_parse_err("host.cpu.1m > 1", 10, "found '1m'");
        assert_parse_err("host. > 1", 6, "expected a field name after 'host.', found ' '");
        assert_parse_err("host.cpu.", 10, "found end of input");
        assert_parse_err(
            "x > 1 or host..cpu.user > 1",
            15,
            "invalid event-name pattern 'host..cpu': empty name segment",
        );
        let long = format!("{}.user > 1", "h".repeat(300));
        assert_parse_err(&long, 257, "longer than 256 bytes");
    }

    #[test]
    fn error_depth_limit() {
        let ok = format!("{}a > 1{}", "(".repeat(MAX_DEPTH), ")".repeat(MAX_DEPTH));
        assert_eq!(on_abc(&ok, [2.0, 0.0, 0.0]), Some(true));
        let deep = format!("{}a > 1{}", "(".repeat(MAX_DEPTH + 1), ")".repeat(MAX_DEPTH + 1));
        assert_parse_err(
            &deep,
            65,
            "expected at most 64 levels of parentheses and 'not', found more",
        );
        let ok = format!("{}a > 1", "not ".repeat(MAX_DEPTH));
        assert_eq!(on_abc(&ok, [2.0, 0.0, 0.0]), Some(true));
        assert_parse_err(&format!("{}a > 1", "not ".repeat(MAX_DEPTH + 1)), 257, "levels");
        // Mixed, and far deeper than the limit: an error, not a stack overflow.
        assert_parse_err(&format!("{}a > 1", "!(".repeat(2000)), 65, "levels");
        assert_parse_err(&"(".repeat(MAX_FILTER_LEN), 65, "levels");
    }

    #[test]
    fn error_length_and_comparison_limits() {
        let pad = |n: usize| format!("a > 1{}", " ".repeat(n - 5));
        assert!(Filter::parse(&pad(MAX_FILTER_LEN)).is_ok());
        assert_parse_err(
            &pad(MAX_FILTER_LEN + 1),
            4097,
            "expected at most 4096 bytes of filter, found 4097",
        );
        // 2048 two-byte characters fill 4096 bytes; the 2049th is the first over the limit.
        assert_parse_err(&"é".repeat(2049), 2049, "found 4098");

        let n = |count: usize| vec!["a>1"; count].join(" or ");
        assert!(Filter::parse(&n(MAX_COMPARISONS)).is_ok());
        assert_parse_err(
            &n(MAX_COMPARISONS + 1),
            256 * 7 + 1,
            "expected at most 256 comparisons, found more",
        );
    }

    fn schemas() -> Vec<EventSchema> {
        vec![
            schema("host.cpu", vec![d("user"), d("system")]),
            schema("host.mem", vec![d("free"), s("unit")]),
            schema("app.exit", exit_schema()),
        ]
    }

    fn validate_err(filter: &str) -> FilterError {
        match Filter::parse(filter).unwrap().validate(&schemas()) {
            Ok(()) => panic!("{filter:?} validated"),
            Err(e) => e,
        }
    }

    fn assert_validate_err(filter: &str, column: usize, needle: &str) {
        let e = validate_err(filter);
        assert_eq!(e.position, column, "{filter:?}: {e}");
        assert!(e.message.contains(needle), "{filter:?}: {e}");
    }

    #[test]
    fn validate_accepts_well_typed_filters() {
        let ok = [
            "host.cpu.user > 50",
            "host.*.user > 50 or free < 1e9",
            "user > 1 and system > 1",
            "unit == 'kB' or kind != \"exit\"",
            "kind == 'exit' and status != 0 and pid > 1",
            "user > system",
            "kind == cmd",
            "not (host.mem.free < 10)",
            "*.status = 0",
        ];
        for f in ok {
            Filter::parse(f)
                .unwrap()
                .validate(&schemas())
                .unwrap_or_else(|e| panic!("{f}: {e}"));
        }
    }

    #[test]
    fn validate_unknown_fields() {
        assert_validate_err(
            "host.cpu.usr > 1",
            1,
            "unknown field 'host.cpu.usr': no event matching 'host.cpu' has a field 'usr'",
        );
        assert_validate_err(
            "user > 1 and hots.cpu.user > 1",
            14,
            "unknown field 'hots.cpu.user': no event matches 'hots.cpu'",
        );
        assert_validate_err(
            "user > 1 or usr > 1",
            13,
            "unknown field 'usr': no event has a field 'usr'",
        );
        assert_validate_err(
            "1 < host.mem.user",
            5,
            "no event matching 'host.mem' has a field 'user'",
        );
        // No schemas: nothing resolves.
        let e = Filter::parse("user > 1").unwrap().validate(&[]).unwrap_err();
        assert_eq!(e.position, 1);
    }

    #[test]
    fn validate_type_mismatches() {
        assert_validate_err(
            "kind > 1",
            1,
            "field 'kind' is a string in event 'app.exit', cannot compare it with a number using '>'",
        );
        assert_validate_err(
            "user > 1 and status == 'x'",
            14,
            "field 'status' is a double in event 'app.exit', cannot compare it with a string using '=='",
        );
        assert_validate_err("'x' != host.cpu.user", 8, "is a double in event 'host.cpu'");
        assert_validate_err("kind = 0", 1, "cannot compare it with a number using '=='");
        // Bare `unit` is a string in host.mem only: fine there; `unit > 3` is not.
        assert_validate_err("unit > 3", 1, "is a string in event 'host.mem'");
        assert_validate_err(
            "kind == status",
            6,
            "cannot compare field 'kind' (string) with field 'status' (double)",
        );
        assert_validate_err("kind < cmd", 6, "ordering needs two doubles");
        assert_validate_err(
            "host.cpu.user > host.mem.free",
            15,
            "fields 'host.cpu.user' and 'host.mem.free' are never in the same event",
        );
    }

    #[test]
    fn bind_type_mismatches() {
        let f = Filter::parse("pid > 1 and kind >= 2").unwrap();
        let e = f.bind("app.exit", &exit_schema()).unwrap_err();
        assert_eq!(e.position, 13);
        assert!(
            e.message.contains("field 'kind' is a string in event 'app.exit'"),
            "{e}"
        );
        // The same filter on an event where `kind` is a double is fine.
        let b = f.bind("other", &[d("pid"), d("kind")]).unwrap().unwrap();
        assert_eq!(b.eval(&[2.0, 2.0], &[]), Some(true));
        let e = Filter::parse("x == 1 or status == \"0\"")
            .unwrap()
            .bind("a", &exit_schema())
            .unwrap_err();
        assert_eq!(e.position, 11);
        assert!(e.message.contains("is a double"), "{e}");
        // A type error in an unresolved part does not arise.
        assert!(Filter::parse("host.cpu.kind > 1")
            .unwrap()
            .bind("app.exit", &exit_schema())
            .unwrap()
            .is_none());
    }

    /// Deterministic pseudo-random inputs: parsing never panics, and whatever parses binds and
    /// evaluates without panicking.
    #[test]
    fn garbage_never_panics() {
        let alphabet: Vec<char> = "ab.*?()!=<>&|'\"\\ -0123456789eE_notandor\u{e9}\t"
            .chars()
            .collect();
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let fields = [d("a"), s("b"), d("c")];
        let mut parsed = 0;
        for _ in 0..20_000 {
            let len = (next() % 24) as usize;
            let text: String = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            let Ok(f) = Filter::parse(&text) else { continue };
            parsed += 1;
            let _ = f.validate(&[schema("a.b", fields.to_vec())]);
            if let Ok(Some(b)) = f.bind("a.b", &fields) {
                let _ = b.eval(&[1.0, f64::NAN], &["x".to_string()]);
                let _ = b.eval(&[], &[]);
            }
        }
        assert!(parsed > 0);
    }
}
