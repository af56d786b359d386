"""The rules behind the door: bookings, series, planned servers, and the audit trail they write."""
