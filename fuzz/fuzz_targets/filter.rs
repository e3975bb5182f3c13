//! `Filter::parse` on arbitrary text; a parsed filter is validated against and bound to fixed
//! schemas, then evaluated on values drawn from the rest of the input.
//!
//! Input: filter text (lossy UTF-8) up to the first NUL byte; the bytes after it feed the
//! values. Oracles besides "never panics": a filter that validates against the schemas binds
//! to each of them; `not (F)` binds exactly when `F` does and evaluates to the Kleene negation.
#![no_main]

use gma_core::event::Layout;
use gma_core::filter::Filter;
use gma_fuzz::{schemas, Values, MAX_INPUT};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_INPUT {
        return;
    }
    let (text, tail) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let text = String::from_utf8_lossy(text);
    let Ok(filter) = Filter::parse(&text) else {
        return;
    };
    assert_eq!(filter.text(), text);
    let schemas = schemas();
    let validated = filter.validate(&schemas).is_ok();
    // Validating against each schema alone must not panic either.
    for s in &schemas {
        let _ = filter.validate(std::slice::from_ref(s));
    }
    let negated = Filter::parse(&format!("not ({text})")).ok();
    let mut values = Values::new(tail);
    for s in &schemas {
        let bound = filter.bind(&s.name, &s.fields);
        if validated {
            assert!(
                bound.is_ok(),
                "validated filter {text:?} does not bind to {}: {bound:?}",
                s.name
            );
        }
        let neg = negated.as_ref().map(|n| n.bind(&s.name, &s.fields));
        if let Some(neg) = &neg {
            assert_eq!(
                neg.is_ok(),
                bound.is_ok(),
                "{text:?} and its negation bind differently to {}",
                s.name
            );
        }
        let Ok(bound) = bound else {
            continue;
        };
        let layout = Layout::of(&s.fields);
        let numbers: Vec<f64> = (0..layout.doubles).map(|_| values.number()).collect();
        let strings: Vec<String> = (0..layout.strings).map(|_| values.string()).collect();
        let Some(bound) = bound else {
            if let Some(Ok(n)) = neg {
                assert!(
                    n.is_none(),
                    "{text:?} does not apply to {} but its negation does",
                    s.name
                );
            }
            continue;
        };
        let v = bound.eval(&numbers, &strings);
        // Short value slices (a caller bug) must give unknown, not panic.
        let _ = bound.eval(&numbers[..numbers.len() / 2], &strings[..strings.len() / 2]);
        let _ = bound.eval(&[], &[]);
        if let Some(Ok(n)) = neg {
            let n = n.unwrap_or_else(|| panic!("{text:?} applies to {} but its negation does not", s.name));
            assert_eq!(
                n.eval(&numbers, &strings),
                v.map(|x| !x),
                "not ({text}) is not the negation on {} numbers={numbers:?} strings={strings:?}",
                s.name
            );
        }
    }
});
