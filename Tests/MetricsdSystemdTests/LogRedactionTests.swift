import Foundation
import Logging
import MetricsdSystemd
import Testing

@Suite struct LogRedactionTests {
    /// A real HS256 JWT (`{"alg":"HS256","typ":"JWT"}` / `{"sub":"42","exp":1761748245}`), as the GTSD API issues.
    static let jwt =
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiI0MiIsImV4cCI6MTc2MTc0ODI0NX0.4Adcj3UFYzPUVaVF43FmMab6RcZLxz9ptxAGH1rK9o8"

    @Test(arguments: [
        "metricsd.jwt.secret", "admin_token", "Authorization", "hb.request.header.authorization", "DB_PASSWORD",
        "metricsd.credential", "metricsd.jwt", "refreshToken", "Set-Cookie", "metricsd.jwt.value",
        "metricsd.token.algorithm_secret",
    ])
    func sensitiveKeysAreRedacted(key: String) {
        #expect(LogRedaction.isSensitiveKey(key))
        #expect(LogRedaction.redact([key: "hunter2"]) == [key: "[redacted]"])
    }

    @Test(arguments: [
        "metricsd.user.id", "metricsd.zone", "hb.request.id", "metricsd.job.id", "error.message",
        // The reload line's list of accepted algorithms, and other words about a secret that are not the secret.
        "metricsd.jwt.algorithms", "metricsd.admin_token.source", "metricsd.password.length",
    ])
    func ordinaryKeysAreKept(key: String) {
        #expect(!LogRedaction.isSensitiveKey(key))
        #expect(LogRedaction.redact([key: "value 1"]) == [key: "value 1"])
    }

    @Test(arguments: [
        ("token \(Self.jwt) rejected", "token [redacted-jwt] rejected"),
        ("\(Self.jwt)", "[redacted-jwt]"),
        ("url?access_token=\(Self.jwt)&x=1", "url?access_token=***&x=1"),
        ("see \(Self.jwt)&x=1", "see [redacted-jwt]&x=1"),
        // Connection strings: the rule libpq's messages get where they are made, here as a backstop.
        (
            "waiting: \"postgresql://metricsd:Pw%zz@db:5432/metricsd\"",
            "waiting: \"postgresql://metricsd:***@db:5432/metricsd\""
        ),
        ("host=db password=s3cret dbname=m", "host=db password=*** dbname=m"),
        (
            "PGPASSWORD='a b' METRICSD_JWT_SECRET=xyz METRICSD_JWT_SECRET_FILE=/etc/credstore/x",
            "PGPASSWORD='***' METRICSD_JWT_SECRET=*** METRICSD_JWT_SECRET_FILE=/etc/credstore/x"
        ),
        (
            "postgresql://metricsd@db1,db2/metricsd?target_session_attrs=read-write",
            "postgresql://metricsd@db1,db2/metricsd?target_session_attrs=read-write"
        ),
        ("unsigned eyJhbGciOiJub25lIn0.eyJzdWIiOiI0MiJ9. end", "unsigned [redacted-jwt] end"),
        ("Authorization: Bearer abc.def-ghi", "Authorization: Bearer [redacted]"),
        ("authorization: bearer  \(Self.jwt)", "authorization: bearer  [redacted]"),
        ("{\"authorization\":\"Bearer xyz\"}", "{\"authorization\":\"Bearer [redacted]\"}"),
        ("Bearer", "Bearer"),
        ("Bearer ", "Bearer "),
        ("eyJ.only.two", "eyJ.only.two"),
        ("eyJhbGciOiJIUzI1NiJ9.twoSegmentsOnly", "eyJhbGciOiJIUzI1NiJ9.twoSegmentsOnly"),
        ("keyJwt.a.b", "keyJwt.a.b"),
        ("Daily unit done for Asia/Kathmandu", "Daily unit done for Asia/Kathmandu"),
        ("ünïcode stays", "ünïcode stays"),
    ])
    func scrub(text: String, expected: String) {
        #expect(LogRedaction.scrub(text) == expected)
    }

    /// What libpq (or metricsd) says about a refused or missing secret is the reason an operator needs: the backstop
    /// masks secrets — a `password=` value, a URL's `user:pass@`, a `…SECRET=`/`…TOKEN=` value — never the words
    /// around them. The journal keeps the reason whole, quotes included; the text format quotes the value.
    @Test(arguments: [
        #"connection to server at "127.0.0.1", port 5432 failed: FATAL:  password authentication failed for user "masked""#,
        #"connection to server on socket "/var/run/postgresql/.s.PGSQL.5432" failed: fe_sendauth: no password supplied"#,
        #"connection to server at "db" (10.0.0.7), port 5432 failed: FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "metricsd", database "metricsd", no encryption"#,
        "the admin token must be at least 16 characters long",
        "METRICSD_JWT_SECRET_FILE: cannot read /etc/credstore/metricsd-jwt-secret (permission denied)",
        "password: 3 attempts, token: refused, secret rotation pending",
    ])
    func reasonsAroundSecretWordsAreKept(reason: String) {
        #expect(LogRedaction.scrub(reason) == reason)
        let record = LogRecord(
            millisecondsSinceEpoch: 0, level: .warning, label: "metricsd", message: "Waiting for database",
            metadata: ["metricsd.error": .string(reason), "metricsd.error.code": "database.connection_failed"])
        let fields = JournalFields.make(record)
        #expect(fields.first { $0.name == "ERROR" }?.value == reason)
        #expect(fields.first { $0.name == "ERROR_CODE" }?.value == "database.connection_failed")
        #expect(TextLines.format(record).contains(#"metricsd.error=""# + reason.replacing(#"""#, with: #"\""#) + #"""#))
    }

    /// The same reasons beside a secret: the secret goes, the reason stays.
    @Test func aReasonBesideASecretKeepsTheReason() {
        let text =
            #"FATAL:  password authentication failed for user "m" (postgresql://m:Pw-123456@db/m, host=db password=Kw-654321 port=5432)"#
        #expect(
            LogRedaction.scrub(text)
                == #"FATAL:  password authentication failed for user "m" (postgresql://m:***@db/m, host=db password=*** port=5432)"#
        )
    }

    @Test func nestedValuesAreRedactedToo() {
        let metadata: Logger.Metadata = [
            "request": [
                "headers": ["authorization": "Bearer abc", "accept": "application/json"],
                "body": .array(["\(Self.jwt)"]),
            ],
            "error.message": .stringConvertible("invalid JWT \(Self.jwt)"),
        ]
        let redacted = LogRedaction.redact(metadata)
        #expect(redacted["error.message"] == "invalid JWT [redacted-jwt]")
        #expect(
            redacted["request"] == [
                "headers": ["authorization": "[redacted]", "accept": "application/json"], "body": ["[redacted-jwt]"],
            ])
    }

    /// No format ever shows a secret: sensitive keys, a JWT in the message, a bearer header in a value.
    @Test func noFormatShowsASecret() throws {
        let secrets = [Self.jwt, "s3cr3t-signing-key", "admin-t0ken", "p4ssw0rd", "abc.def", "url-pw-0123"]
        let record = LogRecord(
            millisecondsSinceEpoch: 1_761_748_245_123,
            level: .error,
            label: "metricsd",
            message: "Rejected \(Self.jwt) (expired) from postgresql://m:url-pw-0123@db/m",
            metadata: [
                "metricsd.jwt.secret": "s3cr3t-signing-key",
                "metricsd.admin.token": "admin-t0ken",
                "metricsd.db.password": "p4ssw0rd",
                "hb.request.header": "Bearer abc.def",
                "metricsd.user.id": "42",
            ]
        )
        let outputs = [
            TextLines.format(record),
            JSONLines.format(record),
            JournalFields.make(record).map { "\($0.name)=\($0.value)" }.joined(separator: "\n"),
        ]
        for output in outputs {
            for secret in secrets {
                #expect(!output.contains(secret), "\(secret) in \(output)")
            }
            #expect(output.contains("[redacted-jwt]") && output.contains("[redacted]") && output.contains("42"))
        }
    }
}
