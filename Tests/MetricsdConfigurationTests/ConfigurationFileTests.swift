import Foundation
import MetricsdConfiguration
import MetricsdHTTP
import MetricsdTestSupport
import Testing

/// The settings file syntax (systemd's `EnvironmentFile=`), and how `metricsd` run by hand combines the
/// environment, the settings file and the credential store.
@Suite struct ConfigurationFileTests {
    @Test func parsesTheEnvironmentFileSyntax() throws {
        let text = """
            # a comment
              ; another comment

            PLAIN=value
              SPACED  =   value with  inner   blanks   \t
            DOUBLE="quoted # not a comment \\"escaped\\" \\$HOME \\\\ \\n"
            SINGLE='literal \\n $HOME "x"'
            JOINED=a"b c"'d e'
            HASH=value # kept
            EMPTY=
            CONTINUED=first \\
            second
            MULTI="line one
            line two"
            LAST=end
            """
        let assignments = try EnvironmentFile.parse(text, path: "/etc/metricsd/metricsd.env")
        let values = Dictionary(assignments.map { ($0.name, $0.value) }, uniquingKeysWith: { $1 })
        #expect(values["PLAIN"] == "value")
        #expect(values["SPACED"] == "value with  inner   blanks")
        #expect(values["DOUBLE"] == #"quoted # not a comment "escaped" $HOME \ \n"#)
        #expect(values["SINGLE"] == #"literal \n $HOME "x""#)
        #expect(values["JOINED"] == "ab cd e")
        #expect(values["HASH"] == "value # kept")
        #expect(values["EMPTY"] == "")
        #expect(values["CONTINUED"] == "first second")
        #expect(values["MULTI"] == "line one\nline two")
        #expect(values["LAST"] == "end")
        #expect(
            assignments.map(\.name) == [
                "PLAIN", "SPACED", "DOUBLE", "SINGLE", "JOINED", "HASH", "EMPTY", "CONTINUED", "MULTI", "LAST",
            ])
        #expect(assignments.first { $0.name == "LAST" }?.line == 15)
        #expect(assignments.first { $0.name == "MULTI" }?.line == 13)
    }

    @Test(arguments: [
        ("A=1\nnot an assignment\n", "/f.env:2: expected NAME=value, got 'not an assignment'"),
        (
            "A=1\n\n# c\nMETRICSD-LISTEN=x\n",
            "/f.env:4: 'METRICSD-LISTEN' is not a variable name (letters, digits and _, not starting with a digit)"
        ),
        ("1A=x\n", "/f.env:1: '1A' is not a variable name (letters, digits and _, not starting with a digit)"),
        ("A=1\nB=\"open\nC=2\n", "/f.env:2: unterminated \" quote"),
        ("A='open\n", "/f.env:1: unterminated ' quote"),
    ])
    func aBadLineIsAnErrorNamingFileAndLine(text: String, message: String) {
        #expect(throws: ConfigurationError.self) { try EnvironmentFile.parse(text, path: "/f.env") }
        do {
            _ = try EnvironmentFile.parse(text, path: "/f.env")
        } catch {
            #expect(error.kind == .fileSyntax)
            #expect(error.message == message)
        }
    }

    /// Exported variables win over the file; credentials in the store win over the file's `*_FILE` but not over
    /// exported ones; the reload file defaults to `metricsd.conf` next to the settings file.
    @Test func environmentFileAndCredentialStorePrecedence() throws {
        let directory = try ScratchFiles.directory("hostenv")
        let store = directory + "/credstore"
        try FileManager.default.createDirectory(atPath: store, withIntermediateDirectories: true)
        try ScratchFiles.write(
            """
            DATABASE_URL=postgresql:///from-file
            METRICSD_LISTEN=127.0.0.1:9001
            METRICSD_WORKERS=5
            METRICSD_JWT_SECRET_FILE=/from/the/file
            METRICSD_ADMIN_TOKEN_FILE=/from/the/file
            """, to: directory + "/metricsd.env")
        try ScratchFiles.write("s" + String(repeating: "x", count: 40), to: store + "/metricsd-jwt-secret")
        try ScratchFiles.write("admin-token-0123456789", to: store + "/metricsd-admin-token")
        try ScratchFiles.write("db-password", to: store + "/metricsd-db-password")
        try ScratchFiles.write("exported-admin-token-0123", to: directory + "/exported-admin-token")
        let base = [
            "METRICSD_ENV_FILE": directory + "/metricsd.env", "METRICSD_CREDSTORE": store,
            "METRICSD_LISTEN": "127.0.0.1:9002", "METRICSD_ADMIN_TOKEN_FILE": directory + "/exported-admin-token",
        ]
        let host = try HostEnvironment(base)
        #expect(!host.underSystemd)
        #expect(host.settingsFile == directory + "/metricsd.env")
        #expect(host.environment["DATABASE_URL"] == "postgresql:///from-file")
        #expect(host.environment["METRICSD_WORKERS"] == "5")
        #expect(host.environment["METRICSD_LISTEN"] == "127.0.0.1:9002", "exported wins over the file")
        #expect(
            host.environment["METRICSD_JWT_SECRET_FILE"] == store + "/metricsd-jwt-secret",
            "the credential wins over the file")
        #expect(
            host.environment["METRICSD_ADMIN_TOKEN_FILE"] == directory + "/exported-admin-token",
            "exported wins over the credential")
        #expect(host.environment["METRICSD_DB_PASSWORD_FILE"] == store + "/metricsd-db-password")
        #expect(host.environment["METRICSD_CONFIG_FILE"] == "-" + directory + "/metricsd.conf")
        #expect(host.settingsFromFile.sorted() == ["DATABASE_URL", "METRICSD_JWT_SECRET_FILE", "METRICSD_WORKERS"])

        // And what the configuration makes of it.
        let configuration = try Configuration(environment: host.environment)
        #expect(configuration.workers == 5)
        #expect(configuration.database.password == "db-password")
        #expect(configuration.tokens.hmacSecret?.utf8.count == 41)
        #expect(configuration.adminToken == "exported-admin-token-0123")
    }

    @Test func underSystemdNothingIsRead() throws {
        let directory = try ScratchFiles.directory("hostenv-systemd")
        try ScratchFiles.write("METRICSD_WORKERS=5\n", to: directory + "/metricsd.env")
        for marker in ["INVOCATION_ID", "CREDENTIALS_DIRECTORY"] {
            let base = ["METRICSD_ENV_FILE": directory + "/metricsd.env", marker: directory]
            let host = try HostEnvironment(base)
            #expect(host.underSystemd)
            #expect(host.environment == base)
        }
    }

    @Test func aMissingDefaultFileIsFineAnExplicitOneIsNot() throws {
        let directory = try ScratchFiles.directory("hostenv-missing")
        #expect(throws: ConfigurationError.self) {
            try HostEnvironment(["METRICSD_ENV_FILE": directory + "/absent.env"])
        }
        do {
            _ = try HostEnvironment(["METRICSD_ENV_FILE": directory + "/absent.env"])
        } catch {
            #expect(error.kind == .fileUnreadable)
            #expect(error.message == "cannot read \(directory)/absent.env (no such file or directory)")
        }
        // A leading "-" makes a named file optional, as in EnvironmentFile=.
        let optional = try HostEnvironment(["METRICSD_ENV_FILE": "-" + directory + "/absent.env"])
        #expect(optional.settingsFile == nil)
        #expect(optional.environment["METRICSD_CONFIG_FILE"] == "-" + directory + "/metricsd.conf")
    }
}
