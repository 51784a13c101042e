"""The clock a chat template's strftime_now reads, fixed to a fixture's date (chat-fixtures.py, continue-fixtures.py):
a datetime class whose now() is that day, to put in place of transformers' chat_template_utils.datetime."""
import datetime as _dt


def fixed_datetime(day):
    """A datetime subclass whose now() is `day` ('YYYY-MM-DD') at midnight."""
    at = _dt.datetime.strptime(day, '%Y-%m-%d')

    class FixedDatetime(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(at.year, at.month, at.day)

    return FixedDatetime
