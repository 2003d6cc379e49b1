//! Instruments and clients from files: what an operator lists (symbols, tick and lot sizes and
//! prices as decimals, price bands, currencies, client limits), turned into the engine's master
//! data and into the table a gateway converts FIX's symbols and decimals with.
//!
//! The engine keeps prices as integers of one *price unit*, 10^-`price_decimals` of the
//! currency (an instruments file sets `price_decimals`, default 4), and quantities as whole
//! units. A decimal converts exactly or not at all: a price with more decimals than the file's
//! scale is off every tick ([`crate::msg::Reason::PriceOffTick`]), a fractional quantity off
//! every lot ([`crate::msg::Reason::QuantityOffLot`]); nothing is rounded. The reference
//! universe the demo and the benchmarks trade ([`crate::flow::reference_master_data`]) is such a
//! file too, generated ([`crate::flow::reference_instruments`], [`crate::flow::reference_clients`]), so every path loads
//! master data the same way.
//!
//! ```toml
//! # instruments.toml
//! price_decimals = 4
//! [[instrument]]
//! symbol = "ACME"
//! tick_size = "0.01"
//! lot_size = "1"
//! reference_price = "101.25"
//! band_low = "91.00"
//! band_high = "111.50"
//! currency = "USD"
//! ```

use std::collections::HashMap;
use std::path::Path;

use crate::book::Listing;
use crate::error::ExchangeError;
use crate::master::{Client, Instrument, MasterData, Status};
use crate::msg::{InstrumentId, Price, Qty};

/// Default decimal places of a price unit.
pub const PRICE_DECIMALS_DEFAULT: u32 = 4;
/// Most decimal places a price unit may have (i64 prices keep 14 integer digits at 4).
pub const PRICE_DECIMALS_MAX: u32 = 8;
/// Most ticks one instrument's ladder may hold (its levels are allocated at start).
pub const LADDER_LEVELS_MAX: u32 = 1 << 20;
/// Default largest order quantity of an instrument.
pub const QTY_MAX_DEFAULT: Qty = 1_000_000;

/// Why a decimal did not convert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecimalError {
    #[error("not a decimal number")]
    Malformed,
    #[error("more decimal places than the scale holds")]
    TooPrecise,
    #[error("out of range")]
    OutOfRange,
}

/// Parses `text` (`-12.345`, `7`, `0.5`) as a count of 10^-`decimals` units, exactly.
///
/// ```
/// use exchange::instruments::{DecimalError, parse_scaled};
/// assert_eq!(parse_scaled("101.25", 4), Ok(1_012_500));
/// assert_eq!(parse_scaled("7", 0), Ok(7));
/// assert_eq!(parse_scaled("0.125", 2), Err(DecimalError::TooPrecise));
/// assert_eq!(parse_scaled("1.2.3", 2), Err(DecimalError::Malformed));
/// assert_eq!(parse_scaled("99999999999999999999", 0), Err(DecimalError::OutOfRange));
/// ```
pub fn parse_scaled(text: &str, decimals: u32) -> Result<i64, DecimalError> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !all_digits(whole) || !all_digits(fraction) {
        return Err(DecimalError::Malformed);
    }
    let fraction = fraction.trim_end_matches('0');
    let Some(padding) = (decimals as usize).checked_sub(fraction.len()) else {
        return Err(DecimalError::TooPrecise);
    };
    // Digit by digit, no allocation: a gateway converts every order's price with this.
    let digits = whole.bytes().chain(fraction.bytes()).chain(std::iter::repeat_n(b'0', padding));
    let mut units: i64 = 0;
    for digit in digits {
        let next = units.checked_mul(10).and_then(|u| u.checked_add(i64::from(digit - b'0')));
        units = next.ok_or(DecimalError::OutOfRange)?;
    }
    Ok(if negative { -units } else { units })
}

/// Formats a count of 10^-`decimals` units as a decimal without trailing zeros.
///
/// ```
/// use exchange::instruments::format_scaled;
/// assert_eq!(format_scaled(1_012_500, 4), "101.25");
/// assert_eq!(format_scaled(1_010_000, 4), "101");
/// assert_eq!(format_scaled(-5, 2), "-0.05");
/// ```
pub fn format_scaled(units: i64, decimals: u32) -> String {
    let mut text = Vec::new();
    write_scaled(&mut text, units, decimals).expect("writing to a Vec cannot fail");
    String::from_utf8(text).expect("digits, a sign and a point")
}

/// [`format_scaled`] into `out`, allocating nothing (a gateway writes every report's prices
/// with it).
pub fn write_scaled(
    out: &mut impl std::io::Write,
    units: i64,
    decimals: u32,
) -> std::io::Result<()> {
    let scale = 10u64.pow(decimals);
    let (whole, mut fraction) = (units.unsigned_abs() / scale, units.unsigned_abs() % scale);
    let sign = if units < 0 { "-" } else { "" };
    if fraction == 0 {
        return write!(out, "{sign}{whole}");
    }
    let mut width = decimals as usize;
    while fraction % 10 == 0 {
        fraction /= 10;
        width -= 1;
    }
    write!(out, "{sign}{whole}.{fraction:0width$}")
}

/// An instruments file: `price_decimals` and one `[[instrument]]` table per instrument.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstrumentsFile {
    /// Decimal places of the engine's price unit (every price below must fit them).
    #[serde(default = "price_decimals_default")]
    pub price_decimals: u32,
    #[serde(rename = "instrument")]
    pub instruments: Vec<InstrumentSpec>,
}

fn price_decimals_default() -> u32 {
    PRICE_DECIMALS_DEFAULT
}

/// One instrument as listed (prices and sizes as decimal strings, so nothing is rounded).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstrumentSpec {
    /// What FIX Symbol (55) and the clients name it by; unique.
    pub symbol: String,
    /// The id on the native protocol and in the engine (default: its place in the file).
    pub id: Option<InstrumentId>,
    pub tick_size: String,
    /// Whole units (the engine's quantities are integers).
    pub lot_size: String,
    pub reference_price: String,
    /// Inclusive price band; orders outside are rejected (`PriceOutsideBand`).
    pub band_low: String,
    pub band_high: String,
    /// Ticks in the order book's ladder, centred on the reference price (default: the band;
    /// more leave room to move the band while trading).
    pub ladder_ticks: Option<u32>,
    /// Largest order quantity (default [`QTY_MAX_DEFAULT`]).
    pub qty_max: Option<Qty>,
    pub currency: String,
}

/// A clients file: one `[[client]]` table per client.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientsFile {
    #[serde(rename = "client")]
    pub clients: Vec<ClientSpec>,
}

/// One client's limits (its credentials are in the server's credentials file).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSpec {
    pub id: u32,
    /// Largest value (price × quantity, in the currency) of one order, as a decimal.
    pub order_value_max: String,
    #[serde(default = "enabled_default")]
    pub enabled: bool,
}

fn enabled_default() -> bool {
    true
}

/// Symbols and the price scale: what a gateway or client converts FIX's fields with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstrumentTable {
    price_decimals: u32,
    symbols: Vec<Option<String>>,
    by_symbol: HashMap<String, InstrumentId>,
}

impl InstrumentTable {
    /// Whether it lists no instrument.
    pub fn is_empty(&self) -> bool {
        self.by_symbol.is_empty()
    }

    /// Decimal places of the price unit.
    pub fn price_decimals(&self) -> u32 {
        self.price_decimals
    }

    /// The instrument a symbol names.
    pub fn id_of(&self, symbol: &str) -> Option<InstrumentId> {
        self.by_symbol.get(symbol).copied()
    }

    /// The symbol of an instrument id.
    pub fn symbol_of(&self, id: InstrumentId) -> Option<&str> {
        self.symbols.get(id as usize)?.as_deref()
    }

    /// A decimal price in price units, exactly.
    pub fn price_units(&self, text: &str) -> Result<Price, DecimalError> {
        parse_scaled(text, self.price_decimals)
    }

    /// Price units as a decimal.
    pub fn price_text(&self, units: Price) -> String {
        format_scaled(units, self.price_decimals)
    }

    /// A decimal quantity in whole units, exactly.
    pub fn qty_units(text: &str) -> Result<Qty, DecimalError> {
        let units = parse_scaled(text, 0)?;
        Qty::try_from(units).map_err(|_| DecimalError::OutOfRange)
    }
}

/// Reads and parses a TOML file of type `T`.
pub fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ExchangeError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ExchangeError::BadInput(format!("{}: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| ExchangeError::BadInput(format!("{}: {e}", path.display())))
}

/// The engine's master data and the symbol table, from the two files.
pub fn load(
    instruments: &InstrumentsFile,
    clients: &ClientsFile,
) -> Result<(MasterData, InstrumentTable), ExchangeError> {
    let decimals = instruments.price_decimals;
    if decimals > PRICE_DECIMALS_MAX {
        let max = PRICE_DECIMALS_MAX;
        return Err(ExchangeError::BadInput(format!("price_decimals {decimals}: at most {max}")));
    }
    let mut table = InstrumentTable { price_decimals: decimals, ..InstrumentTable::default() };
    let mut listed = Vec::new();
    for (place, spec) in instruments.instruments.iter().enumerate() {
        let id = spec.id.unwrap_or(place as InstrumentId);
        let bad =
            |what: String| ExchangeError::BadInput(format!("instrument {}: {what}", spec.symbol));
        let instrument = instrument_of(spec, id, decimals).map_err(bad)?;
        if table.by_symbol.insert(spec.symbol.clone(), id).is_some() {
            return Err(bad("the symbol is listed twice".into()));
        }
        put(&mut table.symbols, id, spec.symbol.clone()).map_err(bad)?;
        put(&mut listed, id, instrument).map_err(bad)?;
    }
    let mut limits = Vec::new();
    for spec in &clients.clients {
        let bad = |what: String| ExchangeError::BadInput(format!("client {}: {what}", spec.id));
        let value = parse_scaled(&spec.order_value_max, decimals)
            .ok()
            .and_then(|v| u64::try_from(v).ok())
            .ok_or_else(|| bad(format!("order_value_max {:?}", spec.order_value_max)))?;
        let client = Client { enabled: spec.enabled, order_value_max: value };
        put(&mut limits, spec.id, client).map_err(bad)?;
    }
    Ok((MasterData { version: 1, instruments: listed, clients: limits }, table))
}

/// Puts `value` at `id` in a table indexed by id.
fn put<T>(table: &mut Vec<Option<T>>, id: u32, value: T) -> Result<(), String> {
    let at = id as usize;
    if table.len() <= at {
        table.resize_with(at + 1, || None);
    }
    match table[at].replace(value) {
        None => Ok(()),
        Some(_) => Err(format!("id {id} is taken twice")),
    }
}

/// One instrument's master data; the error names the field.
fn instrument_of(
    spec: &InstrumentSpec,
    id: InstrumentId,
    decimals: u32,
) -> Result<Instrument, String> {
    let price = |name: &str, text: &str| {
        parse_scaled(text, decimals)
            .map_err(|e| format!("{name} {text:?}: {e} (price_decimals {decimals})"))
    };
    let tick = price("tick_size", &spec.tick_size)?;
    let reference = price("reference_price", &spec.reference_price)?;
    let (band_low, band_high) =
        (price("band_low", &spec.band_low)?, price("band_high", &spec.band_high)?);
    let lot = InstrumentTable::qty_units(&spec.lot_size)
        .map_err(|e| format!("lot_size {:?}: {e} (whole units)", spec.lot_size))?;
    if tick <= 0 || lot == 0 {
        return Err("tick_size and lot_size must be above 0".into());
    }
    let prices = [
        ("reference_price", &spec.reference_price, reference),
        ("band_low", &spec.band_low, band_low),
        ("band_high", &spec.band_high, band_high),
    ];
    if let Some((name, text, _)) = prices.iter().find(|(_, _, price)| price % tick != 0) {
        let tick_text = &spec.tick_size;
        return Err(format!("{name} {text:?} is not on the tick grid (tick_size {tick_text:?})"));
    }
    if !(0 < band_low && band_low <= reference && reference <= band_high) {
        return Err("band_low ≤ reference_price ≤ band_high must hold, all above 0".into());
    }
    let band_ticks = u32::try_from((band_high - band_low) / tick + 1).unwrap_or(u32::MAX);
    let levels = spec.ladder_ticks.unwrap_or(band_ticks).max(band_ticks);
    if levels > LADDER_LEVELS_MAX {
        return Err(format!("{levels} ticks in the ladder: at most {LADDER_LEVELS_MAX}"));
    }
    // Centred on the reference price, moved up if needed so the whole band is on the ladder.
    let centred = reference - Price::from(levels / 2) * tick;
    let ladder_low = centred.min(band_low).max(band_high - Price::from(levels - 1) * tick);
    if ladder_low <= 0 {
        return Err("the ladder reaches prices at or below 0: fewer ladder_ticks".into());
    }
    Ok(Instrument {
        listing: Listing { instrument: id, ladder_low, tick, levels },
        lot,
        qty_max: spec.qty_max.unwrap_or(QTY_MAX_DEFAULT),
        band_low,
        band_high,
        status: Status::Active,
        halted: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acme() -> InstrumentSpec {
        InstrumentSpec {
            symbol: "ACME".into(),
            id: None,
            tick_size: "0.01".into(),
            lot_size: "1".into(),
            reference_price: "101.25".into(),
            band_low: "91".into(),
            band_high: "111.5".into(),
            ladder_ticks: None,
            qty_max: None,
            currency: "USD".into(),
        }
    }

    fn loaded(instruments: Vec<InstrumentSpec>) -> Result<(MasterData, InstrumentTable), String> {
        let file = InstrumentsFile { price_decimals: 4, instruments };
        load(&file, &ClientsFile { clients: vec![] }).map_err(|e| e.to_string())
    }

    #[test]
    fn an_instrument_loads_onto_its_tick_grid_with_the_band_on_its_ladder() {
        let (master, table) = loaded(vec![acme()]).unwrap();
        let acme = master.instrument(0).unwrap();
        assert_eq!((acme.listing.tick, acme.band_low, acme.band_high), (100, 910_000, 1_115_000));
        assert_eq!(acme.listing.levels, 2051, "the band, both ends included");
        assert_eq!((acme.listing.ladder_low, acme.listing.ladder_high()), (910_000, 1_115_000));
        assert_eq!((table.id_of("ACME"), table.symbol_of(0)), (Some(0), Some("ACME")));
        assert_eq!(table.price_text(1_012_500), "101.25");
    }

    #[test]
    fn a_file_that_cannot_be_traded_exactly_is_refused_with_the_field_named() {
        type Spoil = fn(&mut InstrumentSpec);
        let cases: [(Spoil, &str); 5] = [
            (|s| s.band_low = "91.005".into(), "band_low \"91.005\" is not on the tick grid"),
            (|s| s.band_high = "111.505".into(), "band_high \"111.505\" is not on the tick grid"),
            (|s| s.tick_size = "0.00001".into(), "tick_size"),
            (|s| s.lot_size = "0.5".into(), "lot_size"),
            (|s| s.reference_price = "120".into(), "band_low ≤ reference_price"),
        ];
        for (spoil, named) in cases {
            let mut spec = acme();
            spoil(&mut spec);
            let error = loaded(vec![spec]).unwrap_err();
            assert!(error.contains("ACME") && error.contains(named), "{error}");
        }
        let error = loaded(vec![acme(), acme()]).unwrap_err();
        assert!(error.contains("listed twice"), "{error}");
    }
}
