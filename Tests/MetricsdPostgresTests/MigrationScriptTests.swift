import Testing

@testable import MetricsdPostgres

/// How a migration that runs outside a transaction is split into statements: at `;` and `\gexec`, never inside a
/// comment, a quoted string or identifier, or a dollar-quoted body. No database: the splitting alone.
@Suite struct MigrationScriptTests {
    static func split(_ text: String) -> [String] {
        MigrationScript.steps(of: text).map { ($0.generatesStatements ? "gexec: " : "") + $0.sql }
    }

    @Test func statementsEndAtSemicolonsOutsideQuotesAndComments() {
        let text = """
            -- metricsd:no-transaction
            -- a comment; with a semicolon
            CREATE TABLE t (a text DEFAULT 'x;y', "odd;name" int);
            /* a block; /* nested; */ still the comment; */
            INSERT INTO t (a) VALUES (E'it\\'s; escaped'), ('it''s; doubled');
            DO $$ BEGIN PERFORM 1; PERFORM 2; END $$;
            DO $body$ BEGIN RAISE NOTICE '$$;'; END $body$;
            SELECT $1::int, a$b FROM t;
            -- a trailing comment; ignored
            """
        #expect(
            Self.split(text) == [
                "-- metricsd:no-transaction\n-- a comment; with a semicolon\nCREATE TABLE t (a text DEFAULT 'x;y', \"odd;name\" int)",
                "/* a block; /* nested; */ still the comment; */\nINSERT INTO t (a) VALUES (E'it\\'s; escaped'), ('it''s; doubled')",
                "DO $$ BEGIN PERFORM 1; PERFORM 2; END $$",
                "DO $body$ BEGIN RAISE NOTICE '$$;'; END $body$",
                "SELECT $1::int, a$b FROM t",
            ])
    }

    /// psql's `\gexec` ends a statement whose result holds statements to run; it may follow the query on its line.
    @Test func gexecEndsAGeneratingQuery() {
        let text = """
            SELECT format('DROP TABLE %I', relname) FROM pg_class WHERE relname LIKE 'x\\_%'
            \\gexec
            SELECT 'SELECT 1' \\gexec
            SELECT '\\gexec;' AS quoted;
            """
        #expect(
            Self.split(text) == [
                "gexec: SELECT format('DROP TABLE %I', relname) FROM pg_class WHERE relname LIKE 'x\\_%'",
                "gexec: SELECT 'SELECT 1'",
                "SELECT '\\gexec;' AS quoted",
            ])
    }

    /// A backslash in a standard string is a character, not an escape: the quote after it closes the string.
    @Test func backslashesEscapeOnlyInEStrings() {
        #expect(Self.split("SELECT 'a\\'; SELECT 2;") == ["SELECT 'a\\'", "SELECT 2"])
        #expect(Self.split("SELECT some'x'; SELECT e'a\\'b';") == ["SELECT some'x'", "SELECT e'a\\'b'"])
    }

    @Test func theMarkerIsALineOfItsOwn() {
        #expect(Migration(name: "x", sql: "-- metricsd:no-transaction\nSELECT 1;").runsOutsideTransaction)
        #expect(
            Migration(name: "x", sql: "-- about it\n  -- metricsd:no-transaction  \nSELECT 1;").runsOutsideTransaction)
        #expect(
            !Migration(name: "x", sql: "-- runs as -- metricsd:no-transaction says\nSELECT 1;").runsOutsideTransaction)
        #expect(!Migration(name: "x", sql: "SELECT 1;").runsOutsideTransaction)
        let marked = Migration.all.filter(\.runsOutsideTransaction).map(\.name)
        #expect(marked == ["0021_read_index_descending.sql"])
    }

    /// Every migration of this build splits into statements that each hold code (none is only a comment), and a
    /// file marked to run outside a transaction has no BEGIN or COMMIT of its own.
    @Test func theMarkedMigrationsSplitCleanly() {
        for migration in Migration.all where migration.runsOutsideTransaction {
            let steps = MigrationScript.steps(of: migration.sql)
            #expect(steps.count >= 5, "\(migration.name): \(steps.count) statements")
            for step in steps {
                let code = step.sql.split(whereSeparator: \.isNewline).filter { !$0.hasPrefix("--") }.joined()
                #expect(!code.isEmpty, "\(migration.name): a statement of comments only")
                #expect(!["BEGIN", "COMMIT"].contains(code.uppercased()), "\(migration.name): \(code)")
            }
        }
    }
}
