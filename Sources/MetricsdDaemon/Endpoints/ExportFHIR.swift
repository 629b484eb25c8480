import HealthMetrics
import MetricsdHTTP

/// The export as a FHIR R4 `Bundle` of type `collection`: the code system of metricsd's own codes, the person
/// (`Patient`), their weight and height as they are now, and three `Observation`s per metrics row — BMI (LOINC
/// 39156-5, UCUM `kg/m2`), BMR and TDEE (codes `bmr` and `tdee` of ``codeSystem``, UCUM `kcal/d`).
///
/// A row computed from the current settings (`computed_at` at or after their last change) says so with
/// `derivedFrom` the weight and height Observations; older rows were computed from values metricsd no longer
/// holds, so they name none rather than the wrong ones.
enum ExportFHIR {
    /// The code system of BMR and TDEE, published in the API document.
    static let codeSystem = "urn:metricsd:code-system:metrics"
    static let loinc = "http://loinc.org"
    static let ucum = "http://unitsofmeasure.org"
    static let category =
        #"[{"coding":[{"system":"http://terminology.hl7.org/CodeSystem/observation-category","code":"vital-signs","display":"Vital Signs"}]}]"#

    static func opening(_ profile: ExportProfile) -> String {
        var text = #"{"resourceType":"Bundle","type":"collection","entry":["#
        text +=
            #"{"resource":{"resourceType":"CodeSystem","id":"metricsd-metrics","url":"\#(Self.codeSystem)","#
            + #""name":"MetricsdMetrics","status":"active","content":"complete","concept":["#
            + #"{"code":"bmr","display":"Basal metabolic rate (Mifflin-St Jeor)"},"#
            + #"{"code":"tdee","display":"Total daily energy expenditure"}]}}"#
        text +=
            #",{"resource":{"resourceType":"Patient","id":"user-\#(profile.userID)","#
            + #""identifier":[{"system":"urn:metricsd:user-id","value":"\#(profile.userID)"}]}}"#
        let at = profile.settingsUpdatedAt?.iso8601
        if let weight = ExportNumber.decimal(profile.weightKilograms), let at {
            text +=
                ","
                + Self.measurement(
                    "weight-current", loinc: "29463-7", display: "Body weight", value: weight, unit: "kg",
                    profile: profile, at: at)
        }
        if let height = ExportNumber.decimal(profile.heightCentimetres), let at {
            text +=
                ","
                + Self.measurement(
                    "height-current", loinc: "8302-2", display: "Body height", value: height, unit: "cm",
                    profile: profile, at: at)
        }
        return text
    }

    static func measurement(
        _ id: String, loinc: String, display: String, value: String, unit: String, profile: ExportProfile, at: String
    ) -> String {
        #"{"resource":{"resourceType":"Observation","id":"\#(id)","status":"final","category":\#(Self.category),"#
            + #""code":{"coding":[{"system":"\#(Self.loinc)","code":"\#(loinc)","display":"\#(display)"}],"text":"\#(display)"},"#
            + #""subject":{"reference":"Patient/user-\#(profile.userID)"},"effectiveDateTime":"\#(at)","#
            + #""valueQuantity":{"value":\#(value),"unit":"\#(unit)","system":"\#(Self.ucum)","code":"\#(unit)"}}}"#
    }

    /// The three Observations of one row, each after a comma.
    static func row(_ entry: HistoryEntry, profile: ExportProfile) -> String {
        let derived: String
        if let updated = profile.settingsUpdatedAt, entry.computedAt >= updated,
            ExportNumber.decimal(profile.weightKilograms) != nil, ExportNumber.decimal(profile.heightCentimetres) != nil
        {
            derived =
                #","derivedFrom":[{"reference":"Observation/weight-current"},{"reference":"Observation/height-current"}]"#
        } else {
            derived = ""
        }
        let key = "v\(entry.metrics.version)-\(entry.date)"
        let bmiCode =
            #"{"coding":[{"system":"\#(Self.loinc)","code":"39156-5","display":"Body mass index (BMI) [Ratio]"}],"text":"BMI"}"#
        let bmrCode =
            #"{"coding":[{"system":"\#(Self.codeSystem)","code":"bmr","display":"Basal metabolic rate (Mifflin-St Jeor)"}],"text":"BMR"}"#
        let tdeeCode =
            #"{"coding":[{"system":"\#(Self.codeSystem)","code":"tdee","display":"Total daily energy expenditure"}],"text":"TDEE"}"#
        return ","
            + Self.observation(
                "bmi-\(key)", code: bmiCode, vital: true, value: ExportNumber.bmi(entry), unit: "kg/m2", entry, profile,
                derived)
            + ","
            + Self.observation(
                "bmr-\(key)", code: bmrCode, vital: false, value: String(entry.metrics.bmr), unit: "kcal/d", entry,
                profile, derived)
            + ","
            + Self.observation(
                "tdee-\(key)", code: tdeeCode, vital: false, value: String(entry.metrics.tdee), unit: "kcal/d", entry,
                profile, derived)
    }

    static func observation(
        _ id: String, code: String, vital: Bool, value: String, unit: String, _ entry: HistoryEntry,
        _ profile: ExportProfile,
        _ derived: String
    ) -> String {
        #"{"resource":{"resourceType":"Observation","id":"\#(id)","status":"final","#
            + (vital ? #""category":\#(Self.category),"# : "")
            + #""code":\#(code),"subject":{"reference":"Patient/user-\#(profile.userID)"},"#
            + #""effectiveDateTime":"\#(entry.date)","issued":"\#(entry.computedAt.iso8601)","#
            + #""valueQuantity":{"value":\#(value),"unit":"\#(unit)","system":"\#(Self.ucum)","code":"\#(unit)"},"#
            + #""method":{"text":"metricsd formula version \#(entry.metrics.version)"}\#(derived)}}"#
    }
}
