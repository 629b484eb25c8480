import Glibc
import MetricsdSystemd
import Testing

@Suite struct WatchdogConfigurationTests {
    static let ownPid: Int32 = 4242

    @Test(arguments: [
        [:],
        ["WATCHDOG_USEC": "0"],
        ["WATCHDOG_USEC": ""],
        ["WATCHDOG_USEC": "abc"],
        ["WATCHDOG_USEC": "-2000000"],
        ["WATCHDOG_USEC": "+2000000"],
        ["WATCHDOG_USEC": " 2000000"],
        ["WATCHDOG_USEC": "2000000s"],
        ["WATCHDOG_USEC": "2.5"],
        ["WATCHDOG_USEC": "18446744073709551615"],  // USEC_INFINITY
        ["WATCHDOG_USEC": "99999999999999999999999"],
        ["WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"],
        ["WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "4243"],
        ["WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "0"],
        ["WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "pid"],
        ["WATCHDOG_USEC": "2000000", "WATCHDOG_PID": ""],
        ["WATCHDOG_PID": "4242"],
    ])
    func watchdogIsOff(environment: [String: String]) {
        #expect(WatchdogConfiguration.parse(environment: environment, pid: Self.ownPid) == nil)
    }

    @Test func ownPidEnablesItWithHalfTheIntervalAsPingInterval() throws {
        let environment = ["WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"]
        let configuration = try #require(WatchdogConfiguration.parse(environment: environment, pid: Self.ownPid))
        #expect(configuration.interval == .seconds(30))
        #expect(configuration.pingInterval == .seconds(15))
    }

    @Test func absentWatchdogPidEnablesIt() throws {
        let configuration = try #require(
            WatchdogConfiguration.parse(environment: ["WATCHDOG_USEC": "2000000"], pid: Self.ownPid))
        #expect(configuration == WatchdogConfiguration(interval: .seconds(2)))
        #expect(configuration.pingInterval == .seconds(1))
    }

    @Test func oddMicrosecondsHalveExactly() throws {
        let configuration = try #require(
            WatchdogConfiguration.parse(environment: ["WATCHDOG_USEC": "3"], pid: Self.ownPid))
        #expect(configuration.interval == .microseconds(3))
        #expect(configuration.pingInterval == .nanoseconds(1_500))
    }
}

extension ProcessStateTests {
    /// `fromEnvironment()` through libsystemd's `sd_watchdog_enabled`, with the variables set in this process.
    @Suite struct WatchdogEnvironmentTests {
        @Test func libsystemdAgreesWithParse() {
            let pid = getpid()
            let cases: [[String: String?]] = [
                ["WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "\(pid)"],
                ["WATCHDOG_USEC": "2000000", "WATCHDOG_PID": nil],
                ["WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"],
                ["WATCHDOG_USEC": "0", "WATCHDOG_PID": "\(pid)"],
                ["WATCHDOG_USEC": "garbage", "WATCHDOG_PID": nil],
                ["WATCHDOG_USEC": nil, "WATCHDOG_PID": "\(pid)"],
            ]
            for values in cases {
                withEnvironment(values) {
                    let environment = values.compactMapValues { $0 }
                    let expected = WatchdogConfiguration.parse(environment: environment, pid: pid)
                    #expect(WatchdogConfiguration.fromEnvironment() == expected, "\(environment)")
                }
            }
        }

        @Test func ownPidGivesTwoSecondsAndPingsEverySecond() {
            withEnvironment(["WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "\(getpid())"]) {
                let configuration = WatchdogConfiguration.fromEnvironment()
                #expect(configuration?.interval == .seconds(2))
                #expect(configuration?.pingInterval == .seconds(1))
                // sd_watchdog_enabled(0, …) leaves the variables in place.
                #expect(getenv("WATCHDOG_USEC").map { String(cString: $0) } == "2000000")
            }
        }

        @Test func anotherProcessesWatchdogIsIgnored() {
            withEnvironment(["WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"]) {
                #expect(WatchdogConfiguration.fromEnvironment() == nil)
            }
        }
    }
}
