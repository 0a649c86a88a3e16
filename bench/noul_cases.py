"""The cases bench/noul_probe.py asks the scorer: ``noul`` claims in true/false pairs over six
kinds of state (``PAIRS``, and ``HELD_OUT`` written after calibration was chosen), ``choice``
questions whose right label is plain, and ``score`` ladders of states growing in severity."""

from __future__ import annotations

from typing import Any

Pair = tuple[str, Any, str, Any, str]  # kind, true state, true claim, false state, false claim


def _same_claim(kind: str, claim: str, true_state: Any, false_state: Any) -> Pair:
    return (kind, true_state, claim, false_state, claim)


def _same_state(kind: str, state: Any, true_claim: str, false_claim: str) -> Pair:
    return (kind, state, true_claim, state, false_claim)


OUTAGE = {"ticket": "The login page returns HTTP 500 for every user since the deploy at 09:00."}
FEATURE = {"ticket": "Could you add a dark mode to the dashboard? It would be nice."}
REFUND = {"ticket": "I was charged twice for my March subscription. Please refund one charge."}

PAIRS: list[Pair] = [
    # tickets
    _same_state(
        "ticket",
        OUTAGE,
        "The ticket describes a service outage.",
        "The ticket asks for a new feature.",
    ),
    _same_state(
        "ticket",
        FEATURE,
        "The ticket asks for a new feature.",
        "The user reports that something is broken.",
    ),
    _same_state(
        "ticket", REFUND, "The ticket is about billing.", "The ticket is about a login problem."
    ),
    _same_claim(
        "ticket",
        "The ticket reports a software defect.",
        {"ticket": "Login page returns HTTP 500 after the last deploy"},
        {"ticket": "Please send me a copy of last year's invoices."},
    ),
    _same_claim(
        "ticket",
        "The ticket is urgent.",
        {
            "ticket": "Production is down for all customers, we are losing orders every minute!",
            "priority": "P1",
        },
        {"ticket": "Minor typo on the about page, fix whenever convenient.", "priority": "P4"},
    ),
    # code
    _same_claim(
        "code",
        "The function add returns the sum of its arguments.",
        "def add(a, b):\n    return a + b",
        "def add(a, b):\n    return a - b",
    ),
    _same_claim(
        "code",
        "The function can raise ZeroDivisionError.",
        "def ratio(a, b):\n    return a / b",
        "def ratio(a, b):\n    if b == 0:\n        return 0.0\n    return a / b",
    ),
    _same_state(
        "code",
        "class User:\n    def __init__(self, name):\n        self.name = name",
        "The code defines a class named User.",
        "The code defines a function named main.",
    ),
    _same_claim(
        "code",
        "The loop prints the numbers 0 to 9.",
        "for i in range(10):\n    print(i)",
        "for i in range(3):\n    print(i)",
    ),
    _same_claim(
        "code",
        "The pull request is ready to merge.",
        {"pr": {"approvals": 2, "ci": "green"}},
        {"pr": {"approvals": 0, "ci": "red"}},
    ),
    # logs
    _same_claim(
        "log",
        "All tests passed.",
        "The build succeeded: 412 tests passed, 0 failed.",
        "The build failed: 3 tests failed in test_auth.py.",
    ),
    _same_claim(
        "log",
        "The script ran without errors.",
        "Python 3.11 was used to run the script, and it printed 'done'.",
        "Traceback (most recent call last): ... KeyError: 'id'",
    ),
    _same_claim(
        "log",
        "The database connection failed.",
        "2024-05-01 10:02:11 ERROR db: connection refused (postgres:5432), retrying in 5s",
        "2024-05-01 10:02:11 INFO db: connected to postgres:5432 in 12 ms",
    ),
    _same_claim(
        "log",
        "The disk is almost full.",
        "WARN disk /var at 97% used (2.1 GB free)",
        "INFO disk /var at 23% used (310 GB free)",
    ),
    _same_state(
        "log",
        "12:00:01 GET /api/users 200 14ms\n12:00:02 GET /api/users 200 11ms\n"
        "12:00:03 POST /api/orders 201 40ms",
        "Every request in the log succeeded.",
        "The log shows a server error.",
    ),
    # orders
    _same_claim(
        "order",
        "The order has shipped.",
        {"order": {"items": 3, "status": "shipped"}},
        {"order": {"items": 3, "status": "cancelled"}},
    ),
    _same_claim(
        "order",
        "The cart is empty.",
        {"cart": [], "user": "guest"},
        {"cart": ["book", "pen"], "user": "guest"},
    ),
    _same_claim(
        "order",
        "The chair is in stock.",
        {"stock": 12, "product": "chair"},
        {"stock": 0, "product": "chair"},
    ),
    _same_claim(
        "order",
        "The invoice has been paid.",
        "The invoice total is 120 EUR and it was paid on 3 March.",
        "The invoice total is 120 EUR and it is still unpaid, due on 3 March.",
    ),
    _same_state(
        "order",
        {
            "order": {
                "id": 881,
                "total_eur": 250,
                "items": ["laptop stand", "usb hub"],
                "country": "DE",
            }
        },
        "The order total is more than 100 EUR.",
        "The order contains a laptop.",
    ),
    # reviews
    _same_claim(
        "review",
        "The review is positive.",
        "The review says: 'Love it, works perfectly and arrived early.'",
        "The review says: 'Terrible product, broke after one day, want my money back.'",
    ),
    _same_claim(
        "review",
        "The reviewer wants a refund.",
        {"rating": 1, "text": "Stopped working after a week. I want my money back."},
        {"rating": 5, "text": "Great value, I would buy it again."},
    ),
    _same_state(
        "review",
        {"rating": 2, "text": "The battery lasts barely two hours."},
        "The review complains about the battery.",
        "The review praises the battery.",
    ),
    _same_claim(
        "review",
        "The reviewer recommends the product.",
        {"rating": 5, "text": "Highly recommend it to anyone with a small kitchen."},
        {"rating": 1, "text": "Do not buy this, it is a waste of money."},
    ),
    _same_state(
        "review",
        {"rating": 4, "text": "Comfortable shoes, but shipping took three weeks."},
        "The review mentions slow shipping.",
        "The review says the shoes are uncomfortable.",
    ),
    # mail
    _same_claim(
        "mail",
        "This email is spam.",
        "Email: Congratulations! You won a free iPhone, click this link to claim your prize now!!!",
        "Email: Hi Anna, the meeting moved to 3pm tomorrow, same room. Thanks, Ben",
    ),
    _same_state(
        "mail",
        {
            "from": "ben@example.com",
            "subject": "Meeting moved",
            "body": "The meeting moved to 3pm tomorrow, same room.",
        },
        "The email is about a meeting.",
        "The email asks for a payment.",
    ),
    _same_claim(
        "mail",
        "The email asks the reader to reset their password.",
        {
            "subject": "Password reset",
            "body": "Click the link below to reset your password. It expires in 1 hour.",
        },
        {"subject": "Newsletter", "body": "Here are this month's product updates and team news."},
    ),
    _same_claim(
        "mail",
        "The email has an attachment.",
        {"subject": "Report", "attachments": ["q1_report.pdf"], "body": "See the attached report."},
        {"subject": "Report", "attachments": [], "body": "I will send the report tomorrow."},
    ),
    _same_state(
        "mail",
        {
            "from": "hr@acme.com",
            "subject": "Welcome aboard",
            "body": "Welcome to Acme! Your first day is Monday 9:00.",
        },
        "The email welcomes a new employee.",
        "The email announces a layoff.",
    ),
]

# Held out: written after the calibration method was chosen on PAIRS, never used to choose
# anything; reported on their own (``--held-out``).
HELD_OUT: list[Pair] = [
    _same_claim(
        "ticket",
        "The customer cannot log in.",
        {"ticket": "I reset my password twice and still get 'invalid credentials' at sign-in."},
        {"ticket": "Please update the billing address on our account to 5 Main St."},
    ),
    _same_state(
        "ticket",
        {"ticket": "The mobile app crashes when I open the camera screen.", "platform": "iOS"},
        "The problem happens on iOS.",
        "The problem happens on Windows.",
    ),
    _same_claim(
        "ticket",
        "The ticket is a question about pricing.",
        {"ticket": "How much does the team plan cost per seat per month?"},
        {"ticket": "The search box returns no results for any query since this morning."},
    ),
    _same_claim(
        "code",
        "The function returns a list.",
        "def evens(xs):\n    return [x for x in xs if x % 2 == 0]",
        "def count(xs):\n    return len(xs)",
    ),
    _same_state(
        "code",
        "import requests\n\nresp = requests.get(URL, timeout=5)",
        "The code makes an HTTP request.",
        "The code writes to a file.",
    ),
    _same_claim(
        "code",
        "The test is skipped.",
        "@pytest.mark.skip(reason='flaky')\ndef test_upload():\n    assert upload()",
        "def test_upload():\n    assert upload()",
    ),
    _same_claim(
        "log",
        "The service restarted.",
        "09:14:02 WARN worker exited with code 137\n09:14:05 INFO worker started (pid 4411)",
        "09:14:02 INFO handled 1200 requests in the last minute",
    ),
    _same_state(
        "log",
        "2024-07-09 03:00:00 INFO backup finished: 42 GB in 18 min",
        "The backup completed.",
        "The backup ran out of disk space.",
    ),
    _same_claim(
        "log",
        "A request timed out.",
        "POST /api/pay 504 Gateway Timeout after 30000 ms",
        "POST /api/pay 200 OK in 85 ms",
    ),
    _same_claim(
        "order",
        "The order will be delivered to Germany.",
        {"order": {"id": 17, "ship_to": {"city": "Berlin", "country": "DE"}}},
        {"order": {"id": 17, "ship_to": {"city": "Lyon", "country": "FR"}}},
    ),
    _same_state(
        "order",
        {"order": {"items": [{"sku": "mug", "qty": 2}], "coupon": "SPRING10"}},
        "A coupon was applied to the order.",
        "The order contains more than five items.",
    ),
    _same_claim(
        "order",
        "The refund was issued.",
        {"refund": {"amount_eur": 30, "status": "completed"}},
        {"refund": {"amount_eur": 30, "status": "rejected"}},
    ),
    _same_claim(
        "review",
        "The reviewer had a problem with customer support.",
        {"rating": 2, "text": "Support never answered my three emails."},
        {"rating": 5, "text": "Lovely colour and very sturdy."},
    ),
    _same_state(
        "review",
        {"rating": 3, "text": "The blender is powerful but very loud."},
        "The review says the product is loud.",
        "The review says the product is too weak.",
    ),
    _same_claim(
        "mail",
        "The email is an invitation to an event.",
        {"subject": "Summer party", "body": "Join us on the roof terrace on 12 July at 6pm!"},
        {"subject": "Your receipt", "body": "Thank you for your purchase of 2 items."},
    ),
    _same_state(
        "mail",
        {
            "from": "it@acme.com",
            "subject": "Laptop return",
            "body": "Please return your old laptop to the IT desk by Friday.",
        },
        "The email asks the reader to return a device.",
        "The email announces a promotion.",
    ),
]

LABELS = {"backend": "server-side code", "frontend": "UI", "billing": "payments and invoices"}
CHOICES = [  # (state, question, labels, right label)
    (OUTAGE, "Which team should handle the ticket?", LABELS, "backend"),
    (REFUND, "Which team should handle the ticket?", LABELS, "billing"),
    (
        {"ticket": "The Save button is hidden behind the footer on small screens."},
        "Which team should handle the ticket?",
        LABELS,
        "frontend",
    ),
    (
        "2024-05-01 10:02:11 ERROR db: connection refused",
        "Which level is this log line?",
        {"INFO": None, "WARN": None, "ERROR": None},
        "ERROR",
    ),
    (
        {"rating": 1, "text": "Broke after a day."},
        "What is the sentiment of the review?",
        {"positive": None, "neutral": None, "negative": None},
        "negative",
    ),
    (
        {"subject": "You won!!!", "body": "Claim your free prize now, click here"},
        "Which folder does the email belong in?",
        {"inbox": None, "spam": None},
        "spam",
    ),
]

SEVERITY = ["trivial", "minor", "major", "critical"]
LADDERS = [  # (question, levels, states from the least to the most severe)
    (
        "How severe is the ticket?",
        SEVERITY,
        [
            {"ticket": "A typo on the about page: 'teh' instead of 'the'."},
            {"ticket": "The avatar upload is slow, it takes about ten seconds."},
            {"ticket": "Checkout fails for about 10% of customers paying by card."},
            {"ticket": "The whole site is down for all users and no orders go through."},
        ],
    ),
    (
        "How positive is the review?",
        ["very negative", "negative", "positive", "very positive"],
        [
            "Awful. Broke on day one, rude support, never again.",
            "Not great, the strap feels cheap.",
            "Good watch, does what it should.",
            "Absolutely love it, the best purchase I made this year!",
        ],
    ),
]
