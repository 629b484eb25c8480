import MetricsdMasking
import Testing

/// The masking rule on its own: known passwords and their fragments, the patterns, and what must stay untouched.
/// (What the binary prints with it — `migrate`, `check-config`, `serve` — is checked in PasswordMaskingTests.)
@Suite struct SecretMaskTests {
    // MARK: Passwords found in connection strings

    @Test(arguments: [
        ("postgresql://metricsd:Wd3%zzEscapePw@db:5432/metricsd", ["Wd3%zzEscapePw"]),
        ("postgresql://metricsd:Xx@Yt9AtSignPw@127.0.0.1/metricsd", ["Xx@Yt9AtSignPw"]),
        ("postgres://u:Br4cket@[::1/db", ["Br4cket"]),
        ("postgresql://u@db/x?sslmode=disable&password=Qu3ryPw&x=1", ["Qu3ryPw"]),
        ("postgresql://u:pw1@db/x?Password=pw2", ["pw1", "pw2"]),
        ("postgresql://u@db/x", []),
        ("postgresql://db:5432/x", []),
        ("host=db user=u password=Kw0rdPw dbname=x", ["Kw0rdPw"]),
        ("host=db password = 'quoted pw\\'s' dbname=x", ["quoted pw's"]),
        ("  PASSWORD=Up  host=db", ["Up"]),
        ("", []),
    ])
    func passwordsInConnectionStrings(conninfo: String, expected: [String]) {
        #expect(ConnectionStringPasswords.find(in: conninfo) == expected)
    }

    // MARK: Known secrets

    /// libpq's messages for the URLs it refuses quote the password whole or in part: none of it survives.
    @Test(arguments: [
        (
            "postgresql://m:Wd3%zzEscapePw@db/m", #"invalid percent-encoded token: "Wd3%zzEscapePw""#,
            #"invalid percent-encoded token: "***""#
        ),
        (
            "postgresql://m:Xx@Yt9AtSignPw@127.0.0.1/m",
            #"could not translate host name "Yt9AtSignPw@127.0.0.1" to address"#,
            #"could not translate host name "***@127.0.0.1" to address"#
        ),
        (
            "postgresql://m:Br4cketLeakPw@[::1:5/m",
            #"end of string reached when looking for matching "]" in IPv6 host address in URI: "postgresql://m:Br4cketLeakPw@[::1:5/m""#,
            #"end of string reached when looking for matching "]" in IPv6 host address in URI: "postgresql://m:***@[::1:5/m""#
        ),
        (
            "postgresql://m:ab/cdSlashPw@127.0.0.1/m", "port 'ab' is not a port number (1–65535)",
            "port '***' is not a port number (1–65535)"
        ),
        ("postgresql://m:S%40fe%21Pw@db/m", "authentication for S@fe!Pw failed", "authentication for *** failed"),
    ])
    func knownPasswordsAndTheirFragmentsAreMasked(url: String, message: String, expected: String) {
        let mask = SecretMask(connectionString: url)
        #expect(mask.apply(message) == expected)
    }

    @Test func credentialAndPGPASSWORDAreKnownToo() {
        let mask = SecretMask(
            connectionString: "host=db", password: "Cr3dential-Pw", environment: ["PGPASSWORD": "EnvPw-0123"])
        #expect(mask.apply("a Cr3dential-Pw b EnvPw-0123 c") == "a *** b *** c")
        #expect(!mask.isEmpty)
        #expect(SecretMask(connectionString: "host=db").isEmpty)
    }

    /// Short pieces are masked only where they stand alone; ordinary words that contain them stay.
    @Test func shortPiecesOnlyStandingAlone() {
        let mask = SecretMask(secrets: ["ort/Longer-Piece"])
        #expect(mask.apply("port 'ort' is not a port number") == "port '***' is not a port number")
        #expect(mask.apply("host Longer-Piece") == "host ***")
    }

    @Test func maskingTwiceChangesNothing() {
        let mask = SecretMask(connectionString: "postgresql://u:Tw1ceMasked@db/x?password=Other-Pw")
        let once = mask.apply("postgresql://u:Tw1ceMasked@db/x?password=Other-Pw failed")
        #expect(once == "postgresql://u:***@db/x?password=*** failed")
        #expect(mask.apply(once) == once)
    }

    @Test func mergingKeepsBothMasks() {
        let merged = SecretMask(secrets: ["Write-Secret"]).merging(SecretMask(secrets: ["Read-Secret"]))
        #expect(merged.apply("Write-Secret Read-Secret") == "*** ***")
    }

    // MARK: Patterns

    @Test(arguments: [
        ("postgresql://metricsd:hunter2-pw@db1:5432,db2/metricsd", "postgresql://metricsd:***@db1:5432,db2/metricsd"),
        (#"URI: "postgres://u:p@ss@[::1/x""#, #"URI: "postgres://u:***@[::1/x""#),
        ("postgresql://u@db/x?password=qpw&sslmode=require", "postgresql://u@db/x?password=***&sslmode=require"),
        ("host=db password=kw-pw dbname=x", "host=db password=*** dbname=x"),
        ("host=db password = 'a b' dbname=x", "host=db password = '***' dbname=x"),
        (
            "PGPASSWORD=abc METRICSD_JWT_SECRET=\"s e c\" METRICSD_ADMIN_TOKEN=t0k",
            "PGPASSWORD=*** METRICSD_JWT_SECRET=\"***\" METRICSD_ADMIN_TOKEN=***"
        ),
        ("url?access_token=abc.def&x=1", "url?access_token=***&x=1"),
    ])
    func patternsMaskWhatTheyRecognise(text: String, expected: String) {
        #expect(SecretPatterns.apply(text) == expected)
        #expect(SecretMask().apply(text) == expected)
    }

    @Test(arguments: [
        "postgresql://metricsd@db1:5432/metricsd?target_session_attrs=read-write",
        "postgresql:///metricsd?host=/var/run/postgresql&user=metricsd",
        "METRICSD_JWT_SECRET_FILE=/etc/credstore/metricsd-jwt-secret",
        "METRICSD_LISTEN=127.0.0.1:8080 user=42",
        "connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  password authentication failed for user \"m\"",
        "mail me@example.org",
        "ünïcode = stays",
    ])
    func ordinaryTextIsUntouched(text: String) {
        #expect(SecretPatterns.apply(text) == text)
    }

    @Test(arguments: [
        ("PGPASSWORD", true), ("db_password", true), ("METRICSD_JWT_SECRET", true), ("METRICSD_JWT_SECRET_FILE", false),
        ("access_token", true), ("DATABASE_URL", false), ("user", false),
    ])
    func secretNames(name: String, secret: Bool) {
        #expect(SecretPatterns.namesSecret(name) == secret)
    }
}
