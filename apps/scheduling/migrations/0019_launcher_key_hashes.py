"""Launcher tokens keep only their key's hash (SHA-256, as node tokens) and its first characters:
existing keys are hashed in place, so launchers keep working with the keys they have."""

import hashlib

import django.utils.timezone
from django.db import migrations, models


def hash_keys(apps, schema_editor):
    LauncherToken = apps.get_model("scheduling", "LauncherToken")
    for token in LauncherToken.objects.all().only("pk", "key"):
        LauncherToken.objects.filter(pk=token.pk).update(
            key_hash=hashlib.sha256(token.key.encode()).hexdigest(), prefix=token.key[:10]
        )


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0018_nodehealth")]

    operations = [
        migrations.AddField(
            model_name="launchertoken",
            name="key_hash",
            field=models.CharField(editable=False, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="launchertoken",
            name="prefix",
            field=models.CharField(
                default="", editable=False, help_text="The key's first characters.", max_length=12
            ),
            preserve_default=False,
        ),
        # A key cannot be recovered from its hash: going back is refused rather than breaking tokens.
        migrations.RunPython(hash_keys, migrations.RunPython.noop, elidable=False),
        migrations.AlterField(
            model_name="launchertoken",
            name="key_hash",
            field=models.CharField(editable=False, max_length=64, unique=True),
        ),
        migrations.RemoveField(model_name="launchertoken", name="key"),
        migrations.AlterField(
            model_name="launchertoken",
            name="created_at",
            field=models.DateTimeField(default=django.utils.timezone.now, editable=False),
        ),
    ]
