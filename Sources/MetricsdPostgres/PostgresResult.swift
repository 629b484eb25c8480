internal import CLibPQ

/// The rows of one statement, in libpq's text format. Immutable once created; freed with the last reference.
public final class PostgresResult: @unchecked Sendable {  // read-only after creation; PGresult has no thread affinity
    private let handle: OpaquePointer
    public let rowCount: Int
    public let columnCount: Int

    init(_ handle: OpaquePointer) {
        self.handle = handle
        self.rowCount = Int(PQntuples(handle))
        self.columnCount = Int(PQnfields(handle))
    }

    deinit { PQclear(self.handle) }

    /// Rows changed by an `INSERT`/`UPDATE`/`DELETE` (`PQcmdTuples`), 0 otherwise.
    public var affectedRows: Int {
        Int(String(cString: PQcmdTuples(self.handle))) ?? 0
    }

    /// The column's value as text, or nil for SQL NULL.
    public func string(_ row: Int, _ column: Int) -> String? {
        guard PQgetisnull(self.handle, Int32(row), Int32(column)) == 0 else { return nil }
        return String(cString: PQgetvalue(self.handle, Int32(row), Int32(column)))
    }

    /// The column as an integer; throws when it is NULL or not an integer.
    public func int(_ row: Int, _ column: Int) throws(PostgresError) -> Int64 {
        guard let value = try self.optionalInt(row, column) else {
            throw self.unexpected(row, column, "NULL where an integer was expected")
        }
        return value
    }

    /// The column as an integer, nil for NULL; throws when it is not an integer.
    public func optionalInt(_ row: Int, _ column: Int) throws(PostgresError) -> Int64? {
        guard PQgetisnull(self.handle, Int32(row), Int32(column)) == 0 else { return nil }
        guard let pointer = PQgetvalue(self.handle, Int32(row), Int32(column)) else { return nil }
        // Parse the C string directly: this is on every hot path.
        var value: Int64 = 0
        var index = 0
        var negative = false
        if pointer[0] == CChar(UInt8(ascii: "-")) {
            negative = true
            index = 1
        }
        guard pointer[index] != 0 else { throw self.unexpected(row, column, "an empty integer") }
        while pointer[index] != 0 {
            let byte = UInt8(bitPattern: pointer[index])
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else {
                throw self.unexpected(row, column, "a non-integer value")
            }
            // Accumulate towards the sign so that Int64.min parses too.
            let digit = Int64(byte - UInt8(ascii: "0"))
            let (product, overflow1) = value.multipliedReportingOverflow(by: 10)
            let (sum, overflow2) =
                negative ? product.subtractingReportingOverflow(digit) : product.addingReportingOverflow(digit)
            guard !overflow1, !overflow2 else { throw self.unexpected(row, column, "an integer overflowing 64 bits") }
            value = sum
            index += 1
        }
        return value
    }

    /// The column as a boolean (`t`/`f`); throws when it is NULL or anything else.
    public func bool(_ row: Int, _ column: Int) throws(PostgresError) -> Bool {
        switch self.string(row, column) {
        case "t": return true
        case "f": return false
        default: throw self.unexpected(row, column, "a non-boolean value")
        }
    }

    /// The column as a non-NULL string; throws for NULL.
    public func requiredString(_ row: Int, _ column: Int) throws(PostgresError) -> String {
        guard let value = self.string(row, column) else { throw self.unexpected(row, column, "NULL") }
        return value
    }

    private func unexpected(_ row: Int, _ column: Int, _ what: String) -> PostgresError {
        let name = PQfname(self.handle, Int32(column)).map { String(cString: $0) } ?? "#\(column)"
        return PostgresError(code: .unexpectedResult, message: "column \(name) of row \(row) holds \(what)")
    }
}
