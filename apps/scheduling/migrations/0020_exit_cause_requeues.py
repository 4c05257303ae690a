"""RankRun.exit_cause (why a rank exited, apart from its code) and Job.requeues (requeues other
than preemptions, bounded by the spec's max_requeues). Exits recorded before are the ranks' own."""

from django.db import migrations, models


def exits_are_their_own(apps, schema_editor):
    RankRun = apps.get_model("scheduling", "RankRun")
    RankRun.objects.filter(state="exited").update(exit_cause="exited")


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0019_launcher_key_hashes"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="requeues",
            field=models.PositiveIntegerField(
                default=0,
                help_text="Times it went back to the queue other than by preemption (a node lost, ranks"
                " fenced or lost, a start timeout); past its spec's max_requeues a fault fails it.",
            ),
        ),
        migrations.AddField(
            model_name="rankrun",
            name="exit_cause",
            field=models.CharField(
                blank=True,
                choices=[
                    ("exited", "exited"),
                    ("lost", "lost"),
                    ("fenced", "fenced"),
                    ("stopped", "stopped"),
                    ("pids_limit", "pids limit"),
                    ("memory_limit", "memory limit"),
                    ("refused", "refused"),
                    ("node_down", "node down"),
                ],
                default="",
                help_text="Why it exited, apart from its code ('' while it runs).",
                max_length=16,
            ),
        ),
        migrations.RunPython(exits_are_their_own, migrations.RunPython.noop),
    ]
