import HealthMetrics
import Testing

@Suite struct TimestampTests {
    @Test(arguments: [
        ("2025-10-29T14:30:45.123Z", Int64(1_761_748_245_123)),
        ("2025-10-29T14:30:45Z", 1_761_748_245_000),
        ("2025-10-29T14:30:45.1Z", 1_761_748_245_100),
        ("2025-10-29T14:30:45.123000000Z", 1_761_748_245_123),
        ("2025-10-29T20:15:45.123+05:45", 1_761_748_245_123),
        ("2025-10-29T04:30:45.123-10:00", 1_761_748_245_123),
        ("2025-10-29t14:30:45.123z", 1_761_748_245_123),
        ("1969-12-31T23:59:59.999Z", -1),
        ("1970-01-01T00:00:00.000Z", 0),
    ])
    func parses(_ text: String, millis: Int64) {
        #expect(Timestamp(iso8601: text)?.millisecondsSinceEpoch == millis)
    }

    @Test(arguments: [
        "", "2025-10-29", "2025-10-29T14:30:45", "2025-10-29T14:30:45.123", "2025-13-29T14:30:45Z",
        "2025-02-30T14:30:45Z", "2025-10-29T24:00:00Z", "2025-10-29T14:60:45Z", "2025-10-29T14:30:45.1234Z",
        "2025-10-29T14:30:45.Z", "2025-10-29T14:30:45+0545", "NaN", "2025-10-29T14:30:45.123Zjunk",
        "'; DROP TABLE users; --", "2025-10-29T14:30:45.1230000000Z",
    ])
    func rejects(_ text: String) {
        #expect(Timestamp(iso8601: text) == nil)
    }

    @Test(arguments: [Int64(1_761_748_245_123), 0, -1, 253_402_300_799_999, 1_000])
    func printsMillisecondsInUTCAndRoundTrips(_ millis: Int64) throws {
        let text = Timestamp(millisecondsSinceEpoch: millis).iso8601
        #expect(text.count == 24)
        #expect(text.hasSuffix("Z"))
        #expect(try #require(Timestamp(iso8601: text)).millisecondsSinceEpoch == millis)
    }

    /// The digits written straight into the string agree with the parser for any instant of years 0001–9999.
    @Test func randomInstantsRoundTrip() throws {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<10_000 {
            let millis = Int64.random(in: -62_135_596_800_000...253_402_300_799_999, using: &generator)
            let text = Timestamp(millisecondsSinceEpoch: millis).iso8601
            #expect(text.utf8.count == 24, "\(text)")
            #expect(Timestamp(iso8601: text)?.millisecondsSinceEpoch == millis, "\(millis) → \(text)")
        }
    }

    /// The explanation sentences, word for word (they are part of every response body).
    @Test func explanationsWordForWord() {
        let metrics = ComputedMetrics(bmiTenths: 332, bmr: 1929, tdee: 2652, version: 1)
        let generic = Explanations(metrics)
        #expect(
            generic.bmi
                == "Your BMI is 33.2, which the World Health Organization classifies as obesity class I (30.0 to 34.9). BMI compares weight with height and does not tell muscle from fat."
        )
        #expect(
            generic.bmr
                == "Your body uses about 1929 kcal a day at complete rest (basal metabolic rate, Mifflin–St Jeor equation from your weight, height, age and gender)."
        )
        #expect(
            generic.tdee
                == "You burn about 2652 kcal a day for your activity level (total daily energy expenditure). Eating about this much keeps your weight stable."
        )
        let named = Explanations(metrics, activityLevel: .lightlyActive)
        #expect(
            named.tdee
                == "You burn about 2652 kcal a day for a \(ActivityLevel.lightlyActive.phrase) lifestyle (total daily energy expenditure). Eating about this much keeps your weight stable."
        )
        #expect(named.bmi == generic.bmi && named.bmr == generic.bmr)
    }

    @Test func examplesFromTheContract() {
        #expect(Timestamp(millisecondsSinceEpoch: 1_761_748_245_123).iso8601 == "2025-10-29T14:30:45.123Z")
        #expect(Timestamp(millisecondsSinceEpoch: -1).iso8601 == "1969-12-31T23:59:59.999Z")
    }
}

@Suite struct LocalDateTests {
    @Test func validDatesOnly() {
        #expect(LocalDate(iso: "2024-02-29") != nil)
        #expect(LocalDate(iso: "2025-02-29") == nil)
        #expect(LocalDate(iso: "2025-04-31") == nil)
        #expect(LocalDate(iso: "0000-01-01") == nil)
        #expect(LocalDate(iso: "2025-1-01") == nil)
        #expect(LocalDate(iso: "2025-10-29T00:00") == nil)
    }

    @Test func daysRoundTrip() throws {
        var date = try #require(LocalDate(iso: "1899-12-25"))
        for _ in 0..<100_000 {
            let next = try #require(date.adding(days: 1))
            #expect(next > date)
            #expect(next.daysSinceEpoch == date.daysSinceEpoch + 1)
            date = next
        }
        #expect(LocalDate(iso: "1970-01-01")?.daysSinceEpoch == 0)
        #expect(LocalDate(iso: "2000-03-01")?.daysSinceEpoch == 11_017)
    }

    @Test(arguments: [
        ("2012-10-29", "2025-10-29", 13), ("2012-10-30", "2025-10-29", 12), ("1980-02-29", "2025-02-28", 44),
        ("1980-02-29", "2025-03-01", 45), ("1980-02-29", "2024-02-29", 44), ("2025-10-29", "2025-10-29", 0),
    ])
    func wholeYears(birth: String, on: String, years: Int) throws {
        let birthDate = try #require(LocalDate(iso: birth))
        #expect(try #require(LocalDate(iso: on)).years(since: birthDate) == years)
    }
}

@Suite struct FixedPointTests {
    @Test(arguments: [
        ("70.50", 2, Int64(7050)), ("70.5", 2, 7050), ("70", 2, 7000), ("-0.5", 1, -5), ("175.0", 1, 1750),
        ("70.500", 2, 7050), ("0.01", 2, 1),
    ])
    func parses(_ text: String, scale: Int, units: Int64) {
        #expect(FixedPoint(parsing: text, scale: scale)?.units == units)
    }

    @Test(arguments: ["", "abc", "70.505", "1e3", "NaN", "Infinity", "70.", ".5", "--1", "7 0", "1234567890123"])
    func rejects(_ text: String) {
        #expect(FixedPoint(parsing: text, scale: 2) == nil)
    }

    @Test func prints() {
        #expect(FixedPoint(units: 245, scale: 1).description == "24.5")
        #expect(FixedPoint(units: -5, scale: 1).description == "-0.5")
        #expect(FixedPoint(units: 7200, scale: 2).trimmedDescription == "72")
        #expect(FixedPoint(units: 7050, scale: 2).trimmedDescription == "70.5")
    }
}

@Suite struct DailyTimeTests {
    @Test func parses() {
        #expect(DailyTime(parsing: "00:05") == DailyTime.default)
        #expect(DailyTime(parsing: "23:59")?.description == "23:59")
        #expect(DailyTime(parsing: "24:00") == nil)
        #expect(DailyTime(parsing: "0:05") == nil)
        #expect(DailyTime(parsing: "00:60") == nil)
        #expect(DailyTime(parsing: "noon") == nil)
    }
}

@Suite struct ExplanationsTests {
    @Test(arguments: [
        (Int64(184), BMICategory.underweight), (185, .normal), (249, .normal), (250, .overweight), (299, .overweight),
        (300, .obesityClass1), (349, .obesityClass1), (350, .obesityClass2), (400, .obesityClass3),
    ])
    func whoBands(tenths: Int64, category: BMICategory) {
        #expect(BMICategory(tenths: tenths) == category)
    }

    /// The sentences go into JSON bodies unescaped: none holds a control character, a quote, a backslash or
    /// U+2028/U+2029, for any BMI band and activity level, and the BMI is printed as `ComputedMetrics.bmi` prints it.
    @Test func sentencesNeedNoJSONEscaping() {
        let levels: [ActivityLevel?] = [nil] + ActivityLevel.allCases
        for tenths in [Int64(0), 5, 99, 184, 185, 249, 250, 299, 300, 349, 350, 399, 400, 999, 1234] {
            for level in levels {
                let explanations = Explanations(
                    ComputedMetrics(bmiTenths: tenths, bmr: 1650, tdee: 2475, version: 1), activityLevel: level)
                for sentence in [explanations.bmi, explanations.bmr, explanations.tdee] {
                    #expect(
                        !sentence.unicodeScalars.contains {
                            $0.value < 0x20 || $0 == "\"" || $0 == "\\" || $0.value == 0x2028 || $0.value == 0x2029
                        }, "\(sentence)")
                }
                #expect(explanations.bmi.hasPrefix("Your BMI is \(FixedPoint(units: tenths, scale: 1).description), "))
            }
        }
        for tenths in Int64(-25)...25 {
            var sink = StringSink()
            Explanations.writeTenths(tenths, into: &sink)
            #expect(sink.text == FixedPoint(units: tenths, scale: 1).description)
        }
    }

    @Test func sentencesNameTheNumbers() {
        let explanations = Explanations(ComputedMetrics(bmiTenths: 245, bmr: 1650, tdee: 2475, version: 1))
        #expect(explanations.bmi.contains("24.5"))
        #expect(explanations.bmi.contains("a healthy weight"))
        #expect(explanations.bmr.contains("1650 kcal"))
        #expect(explanations.tdee.contains("2475 kcal"))
    }
}
