"""`manage.py unix_account USER [NAME]`: set (or show) the Unix account USER's ranks run as."""

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from apps.agent.accounts import local_uid, system_account_refusal, uid_min
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
        parser.add_argument(
            "--system-account",
            action="store_true",
            help="NAME is a service account below UID_MIN on purpose (the nodes' agents must name it"
            " with --system-account too); root is refused all the same",
        )

    def handle(
        self, *args, user: str, name: str | None, reset: bool, system_account: bool = False, **options
    ):
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
            # Checked against this host's accounts (the nodes' usually match); the agents check again.
            uid = 0 if name == "root" else local_uid(name)
            why = "" if uid is None else system_account_refusal(name, uid, uid_min())
            if why and (uid == 0 or not system_account):
                hint = "" if uid == 0 else " (--system-account maps a service account on purpose)"
                raise CommandError(f"NAME: {why}{hint}.")
            UnixAccount.objects.update_or_create(user=found, defaults={"name": name})
        row = UnixAccount.objects.filter(user=found).first()
        self.stdout.write(f"{found.username} runs as {row.name if row else found.username}")
