/// `METRICSD_*` variables that are no setting of this build — a typo, or a setting of a newer build on an older
/// one — which would otherwise be ignored without a word: `serve` logs a warning for each at start, and
/// `check-config` prints one (it fails only for unknown names in the settings file, which only it reads whole).
package enum UnknownSettings {
    /// The unknown `METRICSD_*` names of `environment`, sorted (the tooling's own are none of them:
    /// ``SettingsCatalog/isTooling(_:)``).
    package static func names(in environment: [String: String]) -> [String] {
        environment.keys.filter { name in
            name.hasPrefix("METRICSD_") && SettingsCatalog.setting(name) == nil && !SettingsCatalog.isTooling(name)
        }.sorted()
    }

    /// The warning for one unknown name, with the nearest setting when it looks like a typo of it.
    package static func warning(_ name: String) -> SecretExposure.Warning {
        var text = "not a setting of this build, ignored"
        if let nearest = Self.nearest(name) {
            text += "; did you mean \(nearest)?"
        } else {
            text += " (a setting of a newer metricsd?); `metricsd help` lists the settings"
        }
        return SecretExposure.Warning(setting: name, text: text)
    }

    /// The setting `name` is probably a typo of: at most 3 edits away, or the start of it (`METRICSD_READ_MAX_LAG`).
    static func nearest(_ name: String) -> String? {
        let scored = SettingsCatalog.all.map { (name: $0.name, distance: editDistance(name, $0.name)) }
        if let nearest = scored.min(by: { $0.distance < $1.distance }), nearest.distance <= 3 { return nearest.name }
        guard name.count > 12 else { return nil }
        return SettingsCatalog.all.first { $0.name.hasPrefix(name) || name.hasPrefix($0.name) }?.name
    }
}
