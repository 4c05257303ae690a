"""`manage.py unix_account USER [NAME]`: set (or show) the Unix account USER's ranks run as."""

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from apps.scheduling.models import UnixAccount
from apps.scheduling.node_models import UNIX_NAME


class Command(BaseCommand):
    help = (
        "Map USER to the Unix account NAME their ranks run as on the nodes (without NAME: print the"
        " current one; --reset: back to the username)."
    )

    def add_arguments(self, parser):
        parser.add_argument("user", help="username")
        parser.add_argument("name", nargs="?", help="Unix account name on the nodes")
        parser.add_argument("--reset", action="store_true", help="run as the username again")

    def handle(self, *args, user: str, name: str | None, reset: bool, **options):
        found = get_user_model().objects.filter(username=user).first()
        if found is None:
            raise CommandError(f"unknown user {user!r}")
        if reset:
            UnixAccount.objects.filter(user=found).delete()
        elif name is not None:
            try:
                UNIX_NAME(name)
            except ValidationError as exc:
                raise CommandError(f"NAME: {' '.join(exc.messages)} Got {name!r}.") from None
            UnixAccount.objects.update_or_create(user=found, defaults={"name": name})
        row = UnixAccount.objects.filter(user=found).first()
        self.stdout.write(f"{found.username} runs as {row.name if row else found.username}")
