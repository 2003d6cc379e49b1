//! Flag values that are library enums. The libraries know nothing of clap: each such enum
//! lists its values (`ALL`) and names them (`name`), and [`one_of`] turns that into a clap
//! value parser that accepts exactly those names and lists them in `--help`.

use clap::builder::{PossibleValuesParser, TypedValueParser};

/// A value parser for an enum given by all its values and their names.
pub fn one_of<T>(all: &'static [T], name: fn(T) -> &'static str) -> impl TypedValueParser<Value = T>
where
    T: Copy + Clone + Send + Sync + 'static,
{
    let names: Vec<&'static str> = all.iter().map(|&value| name(value)).collect();
    PossibleValuesParser::new(names).map(move |chosen: String| {
        *all.iter()
            .find(|&&value| name(value) == chosen)
            .expect("PossibleValuesParser admits only the listed names")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Colour {
        Red,
        DarkBlue,
    }

    fn colour_name(colour: Colour) -> &'static str {
        match colour {
            Colour::Red => "red",
            Colour::DarkBlue => "dark-blue",
        }
    }

    #[derive(Parser)]
    struct Flags {
        #[arg(long, value_parser = one_of(&[Colour::Red, Colour::DarkBlue], colour_name))]
        colour: Colour,
    }

    #[test]
    fn accepts_the_names_and_refuses_others_listing_them() {
        let flags = Flags::try_parse_from(["x", "--colour", "dark-blue"]).unwrap();
        assert_eq!(flags.colour, Colour::DarkBlue);
        let error = Flags::try_parse_from(["x", "--colour", "green"]).err().unwrap().to_string();
        assert!(error.contains("green") && error.contains("dark-blue"), "{error}");
    }
}
