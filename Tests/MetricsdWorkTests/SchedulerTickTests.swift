import Testing

@testable import MetricsdWork

/// When the scheduler's minute ticks fire: aligned to the database clock's minutes (a tenth of a second after
/// each), so a unit starts right after it falls due on the database's clock, whatever this host's clock says.
@Suite struct SchedulerTickTests {
    private func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    /// Seconds to the next tick, to the millisecond (ticks are scheduled in whole milliseconds, rounded down).
    private func untilNext(wall: Double, offset: Double, interval: Duration = .seconds(60)) -> Double {
        let now = ContinuousClock.now
        let next = Scheduler.nextTick(
            after: now, interval: interval, databaseClockOffset: offset, wallClock: 1_800_000_000 + wall)
        return (self.seconds(next - now) * 1000).rounded() / 1000
    }

    private func close(_ actual: Double, _ expected: Double) -> Bool { abs(actual - expected) <= 0.0015 }

    @Test func alignedToTheDatabasesMinutePlusATenth() {
        #expect(self.close(self.untilNext(wall: 30, offset: 0), 30.1))
        #expect(
            self.close(self.untilNext(wall: 30, offset: 2.5), 27.6), "the database 2.5 s ahead: its minute comes sooner"
        )
        #expect(self.close(self.untilNext(wall: 30, offset: -0.7), 30.8), "the database 0.7 s behind")
        #expect(
            self.close(self.untilNext(wall: 59.95, offset: 0), 0.15),
            "a tick just before the minute: the next one right after it")
    }

    /// A tick that is already past the database's minute (it covered it) skips the aligned instant a hair away;
    /// one that is not yet past it never does.
    @Test func aTickPastTheMinuteDoesNotTickTwice() {
        #expect(self.close(self.untilNext(wall: 0.05, offset: 0), 60.05))
        #expect(self.close(self.untilNext(wall: 59.99, offset: 0.05), 60.06))
        #expect(self.close(self.untilNext(wall: 59.99, offset: 0), 0.11))
    }

    @Test func longerAndShorterIntervals() {
        #expect(self.close(self.untilNext(wall: 30, offset: 0, interval: .seconds(120)), 90.1))
        #expect(
            self.close(self.untilNext(wall: 30, offset: 5, interval: .seconds(5)), 5), "not whole minutes: not aligned")
        #expect(self.close(self.untilNext(wall: 30, offset: 0, interval: .milliseconds(200)), 0.2))
    }
}
